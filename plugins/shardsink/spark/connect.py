"""The Spark Connect write engine: a write slot as one client session of a long-running server.

With ``SparkOptions(engine="connect")`` a write task does not start a Spark application: the
Airflow task process itself runs the write job's library call (:func:`shardsink.spark.job.write_slot`)
as a Spark Connect client of a server named by an Airflow ``spark_connect`` connection
(``sc://host:15002/;token=...``). The executors, and the Python workers that stage the parts,
are the server's; the manifest is written by the task process, as the spark-submit driver did.

Contracts of :func:`connect_session`:

* one session per slot, created fresh (never a cached ``getOrCreate`` one) and ALWAYS released
  (``stop()`` in ``finally``; SPARK-45680: a session not stopped lives on the server until its
  idle timeout, and too many cached sessions evict running ones, SPARK-45738);
* named after its description and slot: the client's ``user_agent`` and an operation tag
  ``shardsink-write-<desc_id>-slot<n>`` (the server's logs and UI show both);
* checked before any work: an unreachable server raises
  :class:`~shardsink.errors.InvalidConfigurationError` naming the fix; so do (:func:`probe`) a
  server whose Python workers run another minor version of Python (``PYTHON_VERSION_MISMATCH``)
  and one whose Python cannot import shardsink (or runs another version of it), checked at the
  start (``check="start"``) or, for a write slot (:func:`run_over_connect`), just before the
  session's first Python task on the server (``check="python"``): starting a session's Python
  worker daemon costs the server ~1.5 CPU-s, and a small slot of a local-folder shard runs no
  Python there at all (bench/RESULTS.md, issue 45). Retrying cannot help.

HAZARDS. pyspark's ``create()`` marks the whole process as a Connect client (it sets
``SPARK_CONNECT_MODE_ENABLED``, which every later classic ``getOrCreate`` in the process refuses
with SESSION_ALREADY_EXIST); :func:`connect_session` holds that mark only while a session of its
own is open (counted across threads) and puts the environment back after the last one stops.
The URL may hold a token: it is never logged (:func:`redacted`) and never leaves the
process (no XCom, no command line). A client killed mid-write leaves its server-side operation
running until the server notices (its parts are then leftovers the append deletes); it never
writes a manifest, which only the client writes. One driver OOM on the server fails every
session it holds: size the server's driver for the concurrent slots (docs/deployment.md).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import pyarrow as pa

from shardsink.errors import InvalidConfigurationError, StorageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("shardsink.spark")

_PROBE_SCHEMA = "python string, shardsink string"
_SECRET = re.compile(r"(token=)[^;/]*", re.IGNORECASE)


def redacted(url: str) -> str:
    """``url`` with any ``token=`` parameter's value masked (what logs and messages may show)."""
    return _SECRET.sub(r"\1***", url)


def safe_name(name: str) -> str:
    """``name`` as a session may carry it (user agent and operation tag): no commas or spaces."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:200] or "shardsink"


def _with_user_agent(url: str, name: str) -> str:
    """``url`` with ``user_agent=name`` appended to its parameters (a given one is replaced)."""
    base, _, params = url.partition(";") if ";" in url else (url.rstrip("/") + "/", "", "")
    kept = [p for p in params.split(";") if p and not p.lower().startswith("user_agent=")]
    if not base.endswith("/"):
        base += "/"
    return base + ";" + ";".join([*kept, f"user_agent={quote(name)}"])


#: When a session checks the server's Python workers (:func:`probe`): at its start, or before its
#: first Python task on the server (:func:`shardsink.sources.base.before_python_tasks`).
ProbeAt = Literal["start", "python"]


@contextmanager
def connect_session(url: str, *, name: str, timezone: str | None = None,
                    on_session: Callable[[Any], None] | None = None,
                    check: ProbeAt = "start") -> Iterator[SparkSession]:
    """A fresh Spark Connect session on ``url``, named ``name``, probed (:func:`probe`, when
    ``check`` says), and stopped on the way out whatever happens (module docstring).
    ``timezone`` sets the session's ``spark.sql.session.timeZone`` (views run in UTC).
    ``on_session(spark)`` is called once the session is open (who may interrupt it from another
    thread) and ``on_session(None)`` once it is released."""
    from pyspark.sql import SparkSession

    name = safe_name(name)
    if not url.startswith("sc://"):
        raise InvalidConfigurationError(f"Spark Connect URL {redacted(url)!r} must start with sc:// (an Airflow "
                                        "'spark_connect' connection, host HOST, port 15002)", value=redacted(url))
    with _connect_mode():
        try:
            spark = SparkSession.builder.remote(_with_user_agent(url, name)).create()
        except Exception as e:
            raise connect_error(e, url=url, starting=True) from e
        with _released(spark, on_session):
            _open(spark, name, url=url, timezone=timezone, check=check)
            if on_session is not None:
                on_session(spark)
            yield spark


_MODE = "SPARK_CONNECT_MODE_ENABLED"
_mode_lock = threading.Lock()
_mode_holders = 0
_mode_before: str | None = None


@contextmanager
def _connect_mode() -> Iterator[None]:
    """Hold pyspark's process-wide Connect mark (module docstring, HAZARDS) for one session.

    SUBTLE: concurrent slots share the mark (pyspark's functions ask it to build Connect columns):
    only the last holder to leave restores what the environment had before the first one came."""
    global _mode_holders, _mode_before
    with _mode_lock:
        if _mode_holders == 0:
            _mode_before = os.environ.get(_MODE)
        _mode_holders += 1
    try:
        yield
    finally:
        with _mode_lock:
            _mode_holders -= 1
            if _mode_holders == 0:
                if _mode_before is None:
                    os.environ.pop(_MODE, None)
                else:
                    os.environ[_MODE] = _mode_before


@contextmanager
def _released(spark: Any, on_session: Callable[[Any], None] | None) -> Iterator[None]:
    try:
        yield
    finally:
        stop_quietly(spark)
        if on_session is not None:
            on_session(None)


def _open(spark: Any, name: str, *, url: str, timezone: str | None, check: ProbeAt) -> None:
    """Set up and (``check="start"``) probe a new session; failures are refusals (:func:`connect_error`)."""
    from shardsink.sources.base import BEFORE_PYTHON

    try:
        _retries(spark, PROBE_RETRIES)  # an unreachable server fails in about a second
        spark.addTag(name)
        if timezone is not None:
            spark.conf.set("spark.sql.session.timeZone", timezone)
        if check == "start":
            probe(spark)
        else:  # one round trip now: an unreachable server is refused here, and the session is bound
            spark.conf.get("spark.sql.session.timeZone")  # to this server (a restart is SESSION_CHANGED)
            setattr(spark, BEFORE_PYTHON, lambda: _probe_deferred(spark, url))
        _retries(spark, WORK_RETRIES)
    except InvalidConfigurationError:
        raise
    except Exception as e:
        raise connect_error(e, url=url, starting=True) from e
    log.info("Spark Connect session %s (%s) on %s", getattr(spark, "session_id", "?"), name, redacted(url))


#: The client's retries of a failed RPC (pyspark's policy, backoff 50 ms x 4^k up to 60 s): while
#: opening a session (about 1 s in all: the server is there or it is a configuration error) and
#: during the work (about 17 s: a server gone longer fails the task retryably; Airflow retries it).
PROBE_RETRIES = 3
WORK_RETRIES = 5


def _retries(spark: Any, attempts: int) -> None:
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark._client.set_retry_policies([DefaultPolicy(max_retries=attempts)])


def stop_quietly(spark: Any) -> None:
    """``spark.stop()``, logging (not raising) a failure: the work's own outcome is what to report,
    and a server that is gone has released the session anyway."""
    try:
        spark.stop()
    except Exception as e:  # pragma: no cover - depends on the server's state
        log.warning("could not release Spark Connect session: %s: %s", type(e).__name__, str(e)[:300])


def _probe_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """(On the server's Python worker.) The worker's Python minor version and shardsink version.

    Pickled by reference: a worker that cannot import shardsink fails to load it, which
    :func:`connect_error` reports as shardsink missing on the server."""
    import shardsink

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"python": "{}.{}".format(*sys.version_info[:2]),
                                       "shardsink": str(getattr(shardsink, "__version__", "?"))}])


def probe(spark: SparkSession) -> None:
    """Run one tiny Python task on the server; InvalidConfigurationError if its Python workers
    cannot run this client's shardsink code (other Python minor version, shardsink missing or of
    another version). Costs one round trip and, on a warm server, well under a second."""
    import shardsink

    rows = spark.range(1, numPartitions=1).mapInArrow(_probe_rows, _PROBE_SCHEMA).collect()
    server = rows[0]["shardsink"] if rows else "?"
    mine = str(shardsink.__version__)
    if server != mine:
        raise InvalidConfigurationError(
            f"the Spark Connect server's Python runs shardsink {server}, this worker runs {mine}: install the "
            "same shardsink in the server's Python (PYSPARK_PYTHON of the spark-connect service) and restart "
            "the server", value=server)


def _probe_deferred(spark: Any, url: str) -> None:
    """:func:`probe` before a session's first Python task: its refusals as at the start, a server
    lost meanwhile as one lost mid-write (:func:`connect_error`)."""
    try:
        probe(spark)
    except InvalidConfigurationError:
        raise
    except Exception as e:
        raise connect_error(e, url=url, starting=False) from e


def connect_error(e: BaseException, *, url: str, starting: bool) -> BaseException:
    """What a Spark Connect failure means for the caller (``starting``: it happened while the
    session was being opened and probed, before any work):

    * the server's Python workers run another Python minor version, or cannot import shardsink:
      InvalidConfigurationError naming the fix (whenever it happens);
    * the server cannot be reached while starting: InvalidConfigurationError naming the URL;
    * the server went away or lost the session mid-write (a restart): StorageError, retryable
      (the retry opens a new session and stages afresh);
    * anything else: ``e`` itself (its typed record, if it carries one, is read by the caller).
    """
    text = str(e)
    where = redacted(url)
    if "PYTHON_VERSION_MISMATCH" in text:
        got = re.search(r"different version:?\s*(\S+) than that in driver:?\s*(\S+?)[,.]", text)
        versions = f" (server workers {got.group(1)}, this worker {got.group(2)})" if got else ""
        return InvalidConfigurationError(
            f"the Spark Connect server at {where} runs its Python workers on another Python minor "
            f"version{versions}: run the Airflow workers and the server's PYSPARK_PYTHON on the same "
            f"Python {sys.version_info[0]}.{sys.version_info[1]}", value=where)
    if re.search(r"No module named '?(shardsink|msgspec|pyarrow|boto3)", text):
        mod = re.search(r"No module named '?([A-Za-z0-9_.]+)", text)
        return InvalidConfigurationError(
            f"the Spark Connect server at {where} cannot import {mod.group(1) if mod else 'shardsink'} in its "
            "Python workers: install shardsink (with pyarrow, boto3 and msgspec) into the server's Python "
            "(PYSPARK_PYTHON), or put the plugins folder on its PYTHONPATH, and restart the server", value=where)
    gone = _looks_unreachable(text)
    if starting and gone:
        return InvalidConfigurationError(
            f"the Spark Connect server at {where} cannot be reached ({_first_line(text)}): start it (`make connect`, "
            "or the spark-connect service) or fix the Airflow 'spark_connect' connection's host and port",
            value=where)
    if gone or any(s in text for s in ("SESSION_NOT_FOUND", "SESSION_CLOSED", "SESSION_CHANGED", "NO_ACTIVE_SESSION",
                                     "OPERATION_NOT_FOUND", "RETRIES_EXCEEDED",
                                     "server side session identifier")):
        return StorageError(f"the Spark Connect server at {where} went away or lost the session mid-write "
                            f"({_first_line(text)}); the task is retried with a new session")
    return e


def _looks_unreachable(text: str) -> bool:
    low = text.lower()
    return any(s in low for s in ("unavailable", "failed to connect", "connection refused", "deadline_exceeded",
                                  "connection reset", "socket closed", "cannot connect", "failed to resolve"))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def run_over_connect(req: Any, *, url: str, on_session: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Run the write job ``req`` (:mod:`shardsink.spark.request`) in this process as a client of the
    Connect server at ``url``; return its summary, as the spark-submit job reports it.

    Raises the job's own errors (typed shardsink errors, also those carried from the server's
    workers, are raised as such: :func:`shardsink.outcome.record_of`), the refusals of
    :func:`connect_session`, and a retryable StorageError when the server is lost mid-write.
    ``on_session``: as :func:`connect_session`'s. Ingest write slots, re-processing's correction
    job and a view's write job run over Connect (a view's and a correction's sessions in UTC); any
    other request is an InvalidConfigurationError naming it.
    """
    from shardsink.errors import ShardsinkError
    from shardsink.outcome import error_from_record, record_of
    from shardsink.spark.job import write_correction_request, write_slot
    from shardsink.spark.request import IngestCorrectRequest, IngestWriteRequest, ViewWriteRequest
    from shardsink.spark.view_job import write_view_job

    def sessions(timezone: str | None) -> Callable[[str], AbstractContextManager[Any]]:
        return lambda name: connect_session(url, name=name, timezone=timezone, on_session=on_session, check="python")

    if isinstance(req, IngestWriteRequest):
        def run() -> dict[str, Any]:
            return write_slot(req, open_session=sessions(None))
    elif isinstance(req, IngestCorrectRequest):
        def run() -> dict[str, Any]:
            return dict(write_correction_request(req, open_session=sessions("UTC")))
    elif isinstance(req, ViewWriteRequest):
        def run() -> dict[str, Any]:
            return write_view_job(req, open_session=sessions("UTC"))
    else:
        tag = getattr(getattr(req, "__struct_config__", None), "tag", type(req).__name__)
        raise InvalidConfigurationError(f"the {tag!r} job does not run over Spark Connect: give this DAG "
                                        "SparkOptions(engine='submit')", value=str(tag))
    try:
        return run()
    except ShardsinkError:
        raise
    except Exception as e:
        mapped = connect_error(e, url=url, starting=False)
        if mapped is not e:
            raise mapped from e
        typed = error_from_record(record_of(e))
        if typed is not None:
            raise typed from e
        raise
