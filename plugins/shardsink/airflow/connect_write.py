"""The write operator's Spark Connect engine (``SparkOptions(engine="connect")``).

The task process runs the write job's library call itself, as a client session of the
Connect server named by an Airflow ``spark_connect`` connection
(:mod:`shardsink.spark.connect`): no spark-submit, no JVM on the worker. Everything the
spark-submit engine guarantees holds, because the same call runs: the description's fate
was decided before (the committed check), the slot stages fresh parts and writes its
manifest, cancel markers stop sibling slots (a sibling's final failure interrupts this
session's operations), and failures are decided by :func:`shardsink.airflow.failures.for_airflow`
from the typed error (carried from the server's workers when raised there).

Refusals, not retried (:class:`~shardsink.errors.InvalidConfigurationError`, naming the fix):
no such connection, an unreachable server, a server whose Python workers run another minor
version of Python or lack shardsink. A server lost mid-write is retried (a new session stages
afresh; the first one's parts are leftovers). The connection's token never reaches a log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shardsink.errors import InvalidConfigurationError, ShardsinkError

log = logging.getLogger("shardsink.airflow")


def connect_url(conn_id: str) -> str:
    """The ``sc://`` URL of the Airflow ``spark_connect`` connection ``conn_id`` (it may hold a
    token: keep it in memory); InvalidConfigurationError naming the connection if it is missing
    or malformed."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.providers.common.compat.sdk import AirflowNotFoundException

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        raise InvalidConfigurationError(
            f"Spark Connect connection {conn_id!r} is not defined (SparkOptions(connect_conn_id=...), default "
            f"'spark_connect_default'). Define it, e.g. AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": "
            "\"spark_connect\", \"host\": \"HOST\", \"port\": 15002}' (`make connect` starts a local server)",
            value=conn_id) from None
    except (ValueError, TypeError, AttributeError) as e:
        raise InvalidConfigurationError(f"Spark Connect connection {conn_id!r} is malformed: {e}",
                                        value=conn_id) from None


def run_connect_write(*, request: Any, conn_id: str, aws_conn_id: str | None, cancels: Any, cancel_poll: float,
                      on_session: Callable[[Any], None], on_cancel: Callable[[Any], None],
                      cancelled: Callable[[], BaseException | None],
                      final: Callable[[BaseException], bool]) -> dict[str, Any]:
    """Run ``request`` over Connect and return its summary, or raise what the task should raise.

    ``cancels`` (None for one slot) is watched while it runs, calling ``on_cancel(failure)``;
    ``on_session(spark)`` gets the live session (the operator interrupts it on a sibling's
    failure or ``on_kill``); ``cancelled()`` is the exception to fail with if that happened;
    ``final(err)`` says whether a failure is this slot's last, so it records it for its siblings.
    """
    from contextlib import nullcontext

    from shardsink.airflow.credentials import store_access
    from shardsink.airflow.failures import for_airflow
    from shardsink.spark.connect import run_over_connect

    try:
        url = connect_url(conn_id)
        with store_access(aws_conn_id), \
                cancels.watching(on_cancel, every=cancel_poll) if cancels else nullcontext():
            return run_over_connect(request, url=url, on_session=on_session)
    except Exception as e:
        why = cancelled()
        if why is not None:
            raise why from e
        err: BaseException = for_airflow(e) if isinstance(e, ShardsinkError) else e
        if cancels is not None and final(err):
            cancels.record(request.slot, f"{type(err).__name__}: {err}")
        if err is e:
            raise
        raise err from e


def interrupt(spark: Any) -> None:
    """Interrupt every operation of ``spark`` (a Connect session), logging a failure: the
    session is stopped by its owner's ``finally`` either way."""
    try:
        spark.interruptAll()
    except Exception as e:  # pragma: no cover - the server may be gone
        log.warning("could not interrupt the Spark Connect session: %s: %s", type(e).__name__, str(e)[:300])
