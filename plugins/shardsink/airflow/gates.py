"""The gates of a sink DAG run: whether a task goes on now, waits (deferred to Airflow's
triggerer, holding no worker slot), or ends the run's work (skipping the rest but the ``report``).

Every decision is taken from the shard state as the task read it (once: the gates are handed
the facts, they read nothing themselves) and the run's context; a wait raises ``TaskDeferred``
(through the task's ``defer``: the task resumes from the top, see :mod:`shardsink.airflow.triggers`),
an end raises ``DownstreamTasksSkipped`` / ``AirflowSkipException``, so callers push their
XComs before calling.

Why defer, not reschedule: a rescheduled task under a real scheduler can race its own state
(the scheduler logs "finished with state success, but the task instance's state attribute
is queued" and a try_number mismatch, then fails the task), which a ``--run-backwards
--max-active-runs 1`` backfill hits on most runs. Deferring is the wait Airflow 3 provides
for tasks: the triggerer watches, the task keeps its try.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowSkipException, DownstreamTasksSkipped

from shardsink.airflow.run_context import earlier_appends
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.triggers import RESUME_METHOD, EarlierIntervalsTrigger, behind, idle_seconds
from shardsink.core.shard import ShardInfo

log = logging.getLogger("shardsink.airflow")

#: The task every run ends with: lists what the run committed and checks its interval is covered.
REPORT = "report"


def skip_rest(context: dict[str, Any], writers: int) -> None:
    """End the run's work here: mark every downstream task skipped (but the ``report``), this one succeeds.

    Faster than letting later attempts run only to skip themselves (each costs a
    scheduling round). Raises DownstreamTasksSkipped, so push XComs before calling.

    SUBTLE: a mapped write's instances (map_index 0..) must be named one by one; naming
    the task id alone skips only its unexpanded placeholder. If the scheduler expands them
    after this skip anyway, the write operators skip themselves because their description
    XCom is absent.
    """
    rest: list[str | tuple[str, int]] = []
    for t in context["task"].get_flat_relatives(upstream=False):
        if t.task_id == REPORT:
            continue
        rest.append(t.task_id)
        if t.task_id.endswith(".write"):
            rest.extend((t.task_id, i) for i in range(writers))
    if rest:
        raise DownstreamTasksSkipped(tasks=rest)


def nothing_to_do(context: dict[str, Any], reason: str, writers: int) -> NoReturn:
    """Log why, skip the rest of the run (no Spark job, no JVM); the run succeeds."""
    log.info("%s; skipping the rest of this run", reason)
    skip_rest(context, writers)
    raise AirflowSkipException(reason)


def defer(context: dict[str, Any], trigger: Any, reason: str, *, timeout: timedelta | None = None) -> NoReturn:
    """Give the worker slot back until ``trigger`` fires in the triggerer; then the task runs again
    from the top (``RESUME_METHOD`` of :class:`shardsink.provider.operators.ShardTaskOperator`)
    and decides from its own read. The task's state meanwhile is ``deferred`` (same try).
    ``timeout``: past it Airflow fails the try (then the task's retries apply): a wait that
    cannot end, e.g. no triggerer running, surfaces instead of staying deferred for ever."""
    log.info("%s; deferred to the triggerer (the worker slot is released while waiting)", reason)
    context["task"].defer(trigger=trigger, method_name=RESUME_METHOD, timeout=timeout)
    raise AssertionError("unreachable")  # pragma: no cover - defer always raises TaskDeferred


def defer_until(context: dict[str, Any], reason: str, *, at: float) -> NoReturn:
    """:func:`defer` until ``at`` (epoch seconds): a backoff or a poke, waited in the triggerer."""
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    when = datetime.fromtimestamp(at, tz=UTC)
    defer(context, DateTimeTrigger(moment=when), f"{reason}; resuming at {when.isoformat()}")


def retry_gate(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> bool:
    """Before attempt ``attempt`` (>= 2) mints: back off (deferred until the backoff's end) if attempt
    k-1 lost a race.

    Whether there is anything left to do is decided by the caller from the SHARD STATE
    (its target against the shard's upper), not from what attempt k-1 reported. Returns
    whether an earlier attempt of this run already committed its correction.
    """
    earlier = earlier_appends(context, attempt)
    corrected = any(c.corrects for r in earlier for c in r.committed)
    if attempt <= 1 or not earlier:
        return corrected
    prev = earlier[-1]
    resumed = getattr(context.get("task"), "resumed_event", None)
    waited = isinstance(resumed, dict) and resumed.get("status") == "time_reached"  # the triggerer's clock said so
    if prev.lost and prev.retry_at is not None and time.time() < prev.retry_at and not waited:
        defer_until(context, f"attempt {attempt - 1} lost its race; backing off before minting afresh",
                    at=prev.retry_at)
    return corrected


def wait_for_earlier_intervals(settings: IngestSettings, info: ShardInfo, interval_start: int | None,
                               context: dict[str, Any]) -> None:
    """Defer while an earlier interval is not covered yet and the shard is progressing.

    The runs of earlier intervals normally cover them; catching up in parallel would only
    make runs race. But their owner may never come (``--run-backwards`` with one active
    run, a backfill starting above the upper, a failed run): once neither this run's start
    nor the shard's last commit is within ``catch_up_after`` seconds, the run returns and
    catches up itself. While waiting, the task is deferred to an :class:`EarlierIntervalsTrigger`
    that reads the shard's upper every ``poke_interval`` and hands the task back when either
    holds (the same rule, :func:`shardsink.airflow.triggers.idle_seconds`). ``info``: the
    shard's head as the task read it (no read here).
    """
    if interval_start is None or not behind(info, interval_start):
        return
    started = getattr(context.get("dag_run"), "start_date", None)
    run_started = started.timestamp() if isinstance(started, datetime) else None
    idle = idle_seconds(info, run_started, time.time())
    if idle < settings.catch_up_after and not _trigger_said_catch_up(context, info):
        trigger = EarlierIntervalsTrigger(shard_url=settings.shard_url, interval_start=interval_start,
                                          catch_up_after=settings.catch_up_after,
                                          poke_interval=settings.poke_interval, run_started=run_started,
                                          aws_conn_id=settings.aws_conn_id)
        # Bounded: catching up is due after catch_up_after without progress; twice that and
        # a few pokes means the triggerer is not serving this trigger.
        limit = timedelta(seconds=2 * settings.catch_up_after + 5 * settings.poke_interval + 60)
        defer(context, trigger, f"earlier intervals are not covered yet (shard upper {info.upper} < this run's "
                                f"interval start {interval_start}); waiting for their runs ({idle:.0f}s of "
                                f"{settings.catch_up_after:.0f}s without progress before catching up)",
              timeout=limit)
    log.info("no progress on %s for %.0fs: this run catches up from upper %s itself", info.url, idle, info.upper)


def ahead_from(info: ShardInfo, interval: tuple[int | None, int | None], *, watermark: int | None, attempt: int,
               corrects: tuple[int, int] | None, dry_run: bool, reclocked: bool, catch_up_after: float = 300.0
               ) -> int | None:
    """Where this run mints ahead (its interval's start), or None: mint from the shard's upper.

    **Mint ahead**: a backfill's run whose interval starts past the shard's upper does not wait
    for the earlier runs; it mints ``[start, end)`` at once when the source covers it (watermark
    at or past the interval's end), stages it, and its append waits its turn
    (:mod:`shardsink.airflow.append_wait`). Caught up (the upper at or past the start) the mint
    is today's, from the upper. Only attempt 1 mints ahead (a later attempt follows a loss or a
    turn given up: it catches up from the upper); never a correction (it lands at the upper), a
    dry run, a reclocked source (its offsets are bound to times from the upper on), nor with
    ``catch_up_after`` 0 (the DAG asks its runs never to wait for earlier ones: each catches up
    from the upper at once). ``info``: the head as the mint read it (no read here).
    """
    start, end = interval
    if attempt != 1 or corrects is not None or dry_run or reclocked or start is None or end is None \
            or catch_up_after <= 0:
        return None
    if info.upper is None or info.upper >= start or watermark is None or watermark < end:
        return None
    return start


def far_behind(settings: IngestSettings, info: ShardInfo, interval: tuple[int | None, int | None]) -> str | None:
    """Why a NEW shard (no batch committed yet) far behind this run's interval is likely a
    mistake, naming the fix; None when it is not.

    Far: the gap from the shard's upper to the interval's start takes more than ``max_chain``
    batches of ``max_span`` (without a ``max_span`` one batch covers any gap). Typically
    ``start_date`` (the shard's initial upper) lies long before the data: the run then waits
    for earlier runs that never come (``catch_up_after``) and writes the empty batches in
    between, ``max_chain`` per attempt. Not refused: a backfill run backwards over real history
    starts the same way. ``info``: the head as the mint read it (no read here).
    """
    start, span = interval[0], settings.max_span
    if start is None or span is None or info.upper is None or info.stats.batches or info.upper >= start:
        return None
    batches = -(-(start - info.upper) // span)
    if batches <= settings.max_chain:
        return None
    day = datetime.fromtimestamp(start / 1000, UTC)
    return (f"new shard {info.url} starts at upper {info.upper} ({_iso(info.upper)}), {batches} batches of "
            f"{timedelta(milliseconds=span)} before this run's interval start {start} ({_iso(start)}), more than "
            f"max_chain ({settings.max_chain}): this run may wait up to {settings.catch_up_after:.0f}s for earlier "
            f"runs, then writes the batches in between, {settings.max_chain} per attempt (one Spark job per writer "
            "slot each). If the data begins later, start the shard at it: "
            f"set the DAG's start_date=datetime({day.year}, {day.month}, {day.day}, tzinfo=UTC) or "
            f"ShardOptions(initial_upper={start}), and drop this shard, which holds no batch yet "
            f"(shardsink drop {info.url} --yes), so that the next run creates it there")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def covered(settings: IngestSettings, context: dict[str, Any], target: int | None, *, upper: int | None) -> bool:
    return target is not None and upper is not None and upper >= target


def _trigger_said_catch_up(context: dict[str, Any], info: ShardInfo) -> bool:
    """Whether this task resumed from a ``catch_up`` event and the shard made no commit since the
    trigger's read. SUBTLE: the trigger judged the idle time on the triggerer's clock; re-judging
    it on this worker's (possibly skewed) clock could defer again at once, over and over."""
    event = getattr(context.get("task"), "resumed_event", None)
    return (isinstance(event, dict) and event.get("status") == "catch_up"
            and event.get("last_commit_at") == info.last_commit.at)
