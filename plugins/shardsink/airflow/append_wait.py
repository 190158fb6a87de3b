"""The Airflow side of an append minted ahead (a backfill's later interval) waiting its turn.

A run whose interval starts past the shard's upper mints its own description at once
(:func:`shardsink.airflow.gates.ahead_from`) and stages it; its append may commit only once the
upper equals the description's lower. What to do is decided by the sink
(:func:`shardsink.sinks.append.append_run`: Waiting, Lost when an idle wait gives its turn up,
Failed past ``max_append_wait``); this module only carries the wait across hand-backs:

* :func:`turn_of`: the :class:`~shardsink.sinks.append.Turn` so far, from the event the task
  resumed with (the wait's start, whether the watcher saw it idle or timed out, who it waits
  behind), or a fresh one;
* :func:`defer_turn`: defer to a :class:`shardsink.airflow.triggers.TurnTrigger` (no worker slot;
  one head read per poke), which appends the chain through the same call when the upper reaches
  its lower, so the next interval's turn does not wait for this task's trip through the
  scheduler and a worker.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, NoReturn

from shardsink.airflow.gates import defer
from shardsink.airflow.results import TurnCommit
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.triggers import TurnTrigger
from shardsink.sinks.append import Turn, Waiting
from shardsink.sinks.description import Description, to_builtins


def _resumed(context: dict[str, Any], desc: Description) -> dict[str, Any] | None:
    event = getattr(context.get("task"), "resumed_event", None)
    return event if isinstance(event, dict) and event.get("lower") == desc.lower else None


def turn_of(settings: IngestSettings, context: dict[str, Any], desc: Description) -> Turn:
    """The wait of the chain starting with ``desc``: kept from the turn trigger's event when the
    task resumed from one (its start never later than now), else starting now."""
    now = time.time()
    event = _resumed(context, desc) or {}
    since = event.get("waiting_since")
    since = min(float(since), now) if isinstance(since, int | float) and not isinstance(since, bool) else now
    behind = event.get("behind")
    return Turn(since=since, max_wait=settings.max_append_wait, catch_up_after=settings.catch_up_after,
                idle=event.get("status") == "idle", timed_out=event.get("status") == "timeout",
                behind=behind if isinstance(behind, str) else None, dag_id=settings.dag_id)


def defer_turn(settings: IngestSettings, context: dict[str, Any], waiting: Waiting, commit: TurnCommit) -> NoReturn:
    """Defer the append until its turn comes (the trigger appends ``commit`` then); records the
    wait in the ``waiting`` XCom (the Shards page and runbooks read it)."""
    d, since = waiting.desc, waiting.since
    trigger = TurnTrigger(shard_url=settings.shard_url, lower=d.lower, poke_interval=settings.poke_interval,
                          waiting_since=since, deadline=since + settings.max_append_wait,
                          catch_up_after=waiting.catch_up_after, behind=waiting.behind,
                          aws_conn_id=settings.aws_conn_id, commit=to_builtins(commit))
    context["ti"].xcom_push(key="waiting", value={"desc_id": d.desc_id, "lower": d.lower, "upper": waiting.upper,
                                                  "since": since, "behind": waiting.behind})
    limit = timedelta(seconds=since + settings.max_append_wait - time.time() + 5 * settings.poke_interval + 60)
    defer(context, trigger, f"description {d.desc_id} [{d.lower}, {d.upper}) was minted ahead: waiting for the "
                            f"shard's upper {waiting.upper} to reach its lower; it waits behind {waiting.behind}",
          timeout=limit)
