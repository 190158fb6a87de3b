"""The append's gate for a description minted ahead (a backfill's later interval): wait its turn.

A run whose interval starts past the shard's upper mints its own description at once
(:func:`shardsink.airflow.gates.ahead_from`) and stages it; its append may commit only once the
upper equals the description's lower (the conditional put is what keeps it exactly-once, the
wait only keeps it from losing). :func:`wait_turn` decides from the fate the append task read
(its one head read) and the event it resumed with:

* the upper is at or past the lower (or the fate is final): go on, the append settles the fate
  as always (committed, already committed, or lost: its staged objects deleted through the fate
  primitive, and the next attempt mints what is still uncovered);
* waiting longer than ``max_append_wait``: fail the task, naming the description it waits
  behind and the DAG run that owns it; nothing is deleted (the description is StillPossible
  until the upper passes its lower, then GC takes its parts);
* no progress for ``catch_up_after`` and nobody is working at the upper (no description staged
  there, nothing staged lately: e.g. ``--run-backwards`` at one active run, whose earlier runs
  cannot start while this one waits): give the turn up: the attempt ends lost, the next attempt
  catches up from the upper (its staged objects stay StillPossible until the upper passes);
* else: defer to a :class:`shardsink.airflow.triggers.TurnTrigger` (no worker slot; one head
  read per poke), which commits the attempt's chain itself when the upper reaches its lower
  (``commit``): the task resumes to find it committed (:func:`trigger_commits`), and the
  next interval's turn does not wait for this task's trip through the scheduler and a worker.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shardsink.airflow.gates import defer
from shardsink.airflow.results import RESULTS_FORMAT, AppendReport, TurnCommit, TurnCommitted
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.triggers import TurnTrigger
from shardsink.core.fate import Fate, StillPossible
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import Description, decode, to_builtins
from shardsink.sinks.waiting import at_upper, staged_descriptions

log = logging.getLogger("shardsink.airflow")


def waits_behind(shard: Shard, upper: int, *, dag_id: str | None = None) -> str:
    """Who a description waiting at ``upper`` waits behind: the staged description(s) starting at
    the upper with the DAG run owning each, or what is missing (one listing of ``staging/``)."""
    found = at_upper(staged_descriptions(shard), upper)
    if found:
        return "; ".join(s.line(dag_id) for s in found)
    return (f"no description staged at the shard's upper {upper} (the run owning the interval from {upper} has "
            "not minted or staged yet, or failed before staging)")


def _resumed(context: dict[str, Any], desc: Description) -> dict[str, Any] | None:
    event = getattr(context.get("task"), "resumed_event", None)
    return event if isinstance(event, dict) and event.get("lower") == desc.lower else None


def trigger_commits(context: dict[str, Any], desc: Description) -> TurnCommitted | None:
    """What the task's turn trigger committed before handing it back (None: it committed nothing)
    for the chain starting with ``desc``. A claim only: the task checks it against its own reads."""
    event = _resumed(context, desc)
    raw = event.get("committed_by_trigger") if event is not None else None
    if raw is None:
        return None
    try:
        got = decode(raw, TurnCommitted, what="the turn trigger's commits", newest=RESULTS_FORMAT)
    except InvalidUsageError as e:  # the claim only names commits as the task's own: go on without it
        log.warning("%s; the task settles every description from its own reads", e)
        return None
    if got.error is not None:
        log.info("the turn trigger stopped committing (%s) after %d commits; this task settles the rest from its "
                 "own reads", got.error, len(got.commits))
    return got


def wait_turn(settings: IngestSettings, shard: Shard, desc: Description, fate: Fate, attempt: int,
              context: dict[str, Any], *, commit: TurnCommit | None = None) -> dict[str, Any]:
    """Return once ``desc``'s turn has come (module docstring), with what the wait was (``staged_at``,
    ``waited_for``: None if it did not wait); else defer, fail, or end the attempt lost.
    ``commit``: the chain (starting with ``desc``) the trigger commits when the turn comes."""
    now = time.time()
    event = _resumed(context, desc)
    since = event.get("waiting_since") if event is not None else None
    since = min(float(since), now) if isinstance(since, int | float) and not isinstance(since, bool) else now
    behind = event.get("behind") if event is not None else None
    waited = {"staged_at": since, "waited_for": behind if isinstance(behind, str) else None}
    if not isinstance(fate, StillPossible) or fate.upper is None or fate.upper >= desc.lower:
        return waited
    upper = fate.upper
    if behind is None:
        behind = waits_behind(shard, upper, dag_id=settings.dag_id)
        waited["waited_for"] = behind
    what = f"description {desc.desc_id} [{desc.lower}, {desc.upper})"
    if now - since >= settings.max_append_wait or (event is not None and event.get("status") == "timeout"):
        raise AirflowFailException(
            f"{what} waited {now - since:.0f}s (max_append_wait {settings.max_append_wait:.0f}s) for the shard's "
            f"upper {upper} to reach its lower; it waits behind {behind}. Nothing was deleted: its staged parts "
            "stay (still possible) until the upper passes its lower. Fix or clear the run it waits behind, then "
            "clear this task")
    catch_up: float | None = settings.catch_up_after
    if event is not None and event.get("status") == "idle":
        staged = staged_descriptions(shard)
        busy = [s for s in staged if s.lower < desc.lower and now - s.newest < settings.catch_up_after]
        if not at_upper(staged, upper) and not busy:
            _give_up(settings, shard, what, upper, attempt, context)
        catch_up = None  # someone works at or below the upper: wait for it (until max_append_wait)
    trigger = TurnTrigger(shard_url=settings.shard_url, lower=desc.lower, poke_interval=settings.poke_interval,
                          waiting_since=since, deadline=since + settings.max_append_wait, catch_up_after=catch_up,
                          behind=behind, aws_conn_id=settings.aws_conn_id,
                          commit=None if commit is None else to_builtins(commit))
    context["ti"].xcom_push(key="waiting", value={"desc_id": desc.desc_id, "lower": desc.lower, "upper": upper,
                                                  "since": since, "behind": behind})
    limit = timedelta(seconds=since + settings.max_append_wait - now + 5 * settings.poke_interval + 60)
    defer(context, trigger, f"{what} was minted ahead: waiting for the shard's upper {upper} to reach its lower; "
                            f"it waits behind {behind}", timeout=limit)


def _give_up(settings: IngestSettings, shard: Shard, what: str, upper: int, attempt: int,
             context: dict[str, Any]) -> None:
    """End the attempt lost without deleting anything (the description is StillPossible): the next
    attempt catches up from the upper; on the last attempt the task fails."""
    why = (f"{what} gave its turn up: no progress at the shard's upper {upper} for {settings.catch_up_after:.0f}s "
           "and nothing staged there; nothing was deleted (the attempt that catches up deletes its staged objects "
           "once it passes them)")
    log.info("%s", why)
    context["ti"].xcom_push(key="return_value", value=to_builtins(AppendReport(shard=shard.url, lost=(why,),
                                                                               upper=upper, gave_up=True)))
    if attempt < settings.max_attempts:
        raise AirflowSkipException(f"{why}; attempt {attempt + 1} catches up from the upper")
    raise AirflowFailException(f"{why}; no attempt left to catch up (clear the run to continue)")
