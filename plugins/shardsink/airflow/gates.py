"""The gates of a sink DAG run: whether a task goes on now, waits (rescheduled, holding no
worker slot), or ends the run's work (skipping the rest but the ``report``).

Every decision is taken from the shard state as the task read it (once: the gates are handed
the facts, they read nothing themselves) and the run's context; a wait raises
``AirflowRescheduleException``, an end raises ``DownstreamTasksSkipped`` /
``AirflowSkipException``, so callers push their XComs before calling.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowSkipException, DownstreamTasksSkipped

from shardsink.airflow.run_context import earlier_appends
from shardsink.airflow.settings import IngestSettings
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


def reschedule(settings: IngestSettings, reason: str, *, at: float | None = None) -> NoReturn:
    """Give the worker slot back and run this task again later (``at``, epoch seconds, or one poke)."""
    from airflow.sdk.exceptions import AirflowRescheduleException

    when = datetime.fromtimestamp(at if at is not None else time.time() + settings.poke_interval, tz=UTC)
    log.info("%s; rescheduled for %s (the worker slot is released while waiting)", reason, when.isoformat())
    raise AirflowRescheduleException(when)


def retry_gate(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> bool:
    """Before attempt ``attempt`` (>= 2) mints: back off (rescheduled) if attempt k-1 lost a race.

    Whether there is anything left to do is decided by the caller from the SHARD STATE
    (its target against the shard's upper), not from what attempt k-1 reported. Returns
    whether an earlier attempt of this run already committed its correction.
    """
    earlier = earlier_appends(context, attempt)
    corrected = any(c.corrects for r in earlier for c in r.committed)
    if attempt <= 1 or not earlier:
        return corrected
    prev = earlier[-1]
    if prev.lost and prev.retry_at is not None and time.time() < prev.retry_at:
        reschedule(settings, f"attempt {attempt - 1} lost its race; backing off before minting afresh",
                   at=prev.retry_at)
    return corrected


def wait_for_earlier_intervals(settings: IngestSettings, info: ShardInfo, interval_start: int | None,
                               context: dict[str, Any]) -> None:
    """Reschedule while an earlier interval is not covered yet and the shard is progressing.

    The runs of earlier intervals normally cover them; catching up in parallel would only
    make runs race. But their owner may never come (``--run-backwards`` with one active
    run, a backfill starting above the upper, a failed run): once neither this run's start
    nor the shard's last commit is within ``catch_up_after`` seconds, the run returns and
    catches up itself. ``info``: the shard's head as the task read it (no read here).
    """
    upper = info.upper
    if interval_start is None or upper is None or upper >= interval_start:
        return
    last = info.last_commit
    started = getattr(context.get("dag_run"), "start_date", None)
    marks = [datetime.fromisoformat(last.at).timestamp()]
    if isinstance(started, datetime):
        marks.append(started.timestamp())
    idle = time.time() - max(marks)
    if idle < settings.catch_up_after:
        reschedule(settings, f"earlier intervals are not covered yet (shard upper {upper} < this run's interval "
                             f"start {interval_start}); waiting for their runs ({idle:.0f}s of "
                             f"{settings.catch_up_after:.0f}s without progress before catching up)")
    log.info("no progress on %s for %.0fs: this run catches up from upper %d itself", info.url, idle, upper)


def covered(settings: IngestSettings, context: dict[str, Any], target: int | None, *, upper: int | None) -> bool:
    return target is not None and upper is not None and upper >= target
