"""The ingest DAG's task bodies (mint, append) and the write operator.

Tasks talk to the shard store and the source only; they never touch Airflow's metadata
database. XCom carries a description (id, bounds, attempt) and small results, never
data, paths of staged parts, or secrets.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, DownstreamTasksSkipped

from shardsink.core import checks as ck
from shardsink.core.shard import AppendResult, Shard
from shardsink.errors import (
    CorruptionError,
    InvalidUsageError,
    ShardClosedError,
    ShardsinkError,
    UpperMismatchError,
)
from shardsink.provider.operators import ShardTaskMixin
from shardsink.reclock.source import after_commit
from shardsink.sinks.ingest import (
    Committed,
    Description,
    LostRaceError,
    NoOp,
    append_from_manifests,
    committed,
    open_or_create,
)
from shardsink.sinks.reprocess import check_range
from shardsink.sources.base import source_from_spec

log = logging.getLogger("shardsink.airflow")


@dataclass(frozen=True)
class IngestSettings:
    """Everything the tasks of one sink DAG share (static, set by the DAG file).

    For a materialize (view) DAG ``source_spec`` holds the view spec and ``writers`` is 1.
    ``max_attempts`` bounds the attempt groups of a run (each commits up to ``max_chain``
    descriptions); ``catch_up_after`` is how long a run whose earlier interval is not
    covered yet waits for the shard to progress before catching up itself; while waiting
    it is rescheduled every ``poke_interval`` seconds (holding no worker slot).
    """

    dag_id: str
    shard_url: str
    source_spec: dict[str, Any]
    writers: int
    max_span: int | None
    max_attempts: int
    initial_upper: int
    backoff_base: float = 2.0
    backoff_cap: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    #: The shard's retention to keep set (a duration spec, "none" = all history); None: unmanaged.
    retention: str | None = None
    #: Airflow ``aws`` connection for S3 stores (:mod:`shardsink.airflow.credentials`); None: the environment.
    aws_conn_id: str | None = None
    max_chain: int = 16
    catch_up_after: float = 300.0
    poke_interval: float = 15.0
    sample_rows: int = 5

    def __post_init__(self) -> None:
        """Range-check every time, duration and count (a DAG file with a bad one fails to parse, naming it)."""
        ck.check_count(self.writers, what="writers", lo=1)
        ck.check_count(self.max_attempts, what="max_attempts", lo=1)
        ck.check_count(self.max_chain, what="max_chain", lo=1)
        ck.check_count(self.sample_rows, what="sample_rows")
        ck.check_time(self.initial_upper, what="initial_upper")
        if self.max_span is not None:
            ck.check_duration_ms(self.max_span, what="max_span")
        for what, value, positive in (("backoff_base", self.backoff_base, False), ("backoff_cap", self.backoff_cap,
                                      False), ("catch_up_after", self.catch_up_after, False),
                                      ("poke_interval", self.poke_interval, True)):
            ck.check_seconds(value, what=what, positive=positive)

    def backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff before attempt ``attempt`` (>= 2)."""
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 2)))


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def interval_of(context: dict[str, Any]) -> tuple[int | None, int | None]:
    """The run's data interval in ms (``airflow dags test D L`` covers the period ending at L)."""
    end = _millis(context.get("data_interval_end")) or _millis(context.get("logical_date"))
    return _millis(context.get("data_interval_start")), end


@dataclass(frozen=True)
class RunOptions:
    """What a run's params / conf ask for (DAG params ``dry_run``, ``reprocess*``)."""

    dry_run: bool
    corrects: tuple[int, int] | None


def run_options(context: dict[str, Any]) -> RunOptions:
    """The run's options from its params (run conf overrides DAG params); InvalidUsageError on bad ones."""
    from shardsink.sinks.reprocess import requested_range

    params = dict(context.get("params") or {})
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    params.update(conf)
    dry = params.get("dry_run") in (True, "true", "True", 1)
    return RunOptions(dry, requested_range(params, interval=interval_of(context)))


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


#: The task every run ends with: lists what the run committed and checks its interval is covered.
REPORT = "report"


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


def _earlier(context: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    """The append results of attempts 1..attempt-1 of this run (those that ran)."""
    ti = context["ti"]
    out = []
    for k in range(1, attempt):
        got = ti.xcom_pull(task_ids=f"attempt_{k}.append")
        if isinstance(got, dict):
            out.append(got)
    return out


def retry_gate(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> bool:
    """Before attempt ``attempt`` (>= 2) mints: back off (rescheduled) if attempt k-1 lost a race.

    Whether there is anything left to do is decided by the caller from the SHARD STATE
    (its target against the shard's upper), not from what attempt k-1 reported. Returns
    whether an earlier attempt of this run already committed its correction.
    """
    earlier = _earlier(context, attempt)
    corrected = any(c.get("corrects") for r in earlier for c in r.get("committed", []))
    if attempt <= 1 or not earlier:
        return corrected
    prev = earlier[-1]
    retry_at = prev.get("retry_at")
    if prev.get("lost") and isinstance(retry_at, (int, float)) and time.time() < retry_at:
        reschedule(settings, f"attempt {attempt - 1} lost its race; backing off before minting afresh", at=retry_at)
    return corrected


def wait_for_earlier_intervals(settings: IngestSettings, shard: Shard, interval_start: int | None,
                               context: dict[str, Any]) -> None:
    """Reschedule while an earlier interval is not covered yet and the shard is progressing.

    The runs of earlier intervals normally cover them; catching up in parallel would only
    make runs race. But their owner may never come (``--run-backwards`` with one active
    run, a backfill starting above the upper, a failed run): once neither this run's start
    nor the shard's last commit is within ``catch_up_after`` seconds, the run returns and
    catches up itself.
    """
    upper = shard.info().upper
    if interval_start is None or upper is None or upper >= interval_start:
        return
    last = shard.info().last_commit
    started = getattr(context.get("dag_run"), "start_date", None)
    marks = [datetime.fromisoformat(last.at).timestamp()]
    if isinstance(started, datetime):
        marks.append(started.timestamp())
    idle = time.time() - max(marks)
    if idle < settings.catch_up_after:
        reschedule(settings, f"earlier intervals are not covered yet (shard upper {upper} < this run's interval "
                             f"start {interval_start}); waiting for their runs ({idle:.0f}s of "
                             f"{settings.catch_up_after:.0f}s without progress before catching up)")
    log.info("no progress on %s for %.0fs: this run catches up from upper %d itself", shard.url, idle, upper)


def covered(settings: IngestSettings, context: dict[str, Any], target: int | None, *, upper: int | None) -> bool:
    return target is not None and upper is not None and upper >= target


def push_plan(context: dict[str, Any], **plan: Any) -> None:
    context["ti"].xcom_push(key="plan", value=plan)


def mint_task(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Mint attempt ``attempt``'s descriptions (a chain up to the run's target), or skip the rest.

    The run's **target** is ``min(interval end, watermark)``: the run is green only once the
    shard's upper reaches it (the ``report`` task checks). A covered target is a quick no-op.
    A run behind an uncovered earlier interval waits (rescheduled) for it, then catches up.
    Re-processing (``reprocess_from``/``reprocess_to`` or ``reprocess``) puts the correction
    into the first description; ``dry_run`` computes and reports, then ends the run.
    """
    from shardsink.sinks.ingest import mint_chain

    try:
        opts = run_options(context)
    except InvalidUsageError as e:
        raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    corrected = retry_gate(settings, attempt, context)
    run_id = context["dag_run"].run_id
    source = source_from_spec(settings.source_spec)
    start, interval_end = interval_of(context)
    shard = open_or_create(settings.shard_url, source, initial_upper=settings.initial_upper)
    corrects = None if corrected else opts.corrects
    if corrects is not None:
        try:
            check_range(shard, *corrects)
        except ShardsinkError as e:
            raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    wm = source.watermark()
    target = None if wm is None else min(b for b in (wm, interval_end) if b is not None)
    if corrects is None and not opts.dry_run and start is not None and wm is not None:
        # Only the part of the earlier intervals the source can fill is worth waiting for: a
        # run whose target is covered already (or whose interval lies past the watermark
        # and the shard reached it) ends at once.
        wait_for_earlier_intervals(settings, shard, min(start, wm), context)
    out = mint_chain(shard, source, interval_end=interval_end, max_span=settings.max_span, max_chain=settings.max_chain,
                     dag_id=settings.dag_id, run_id=run_id, attempt=attempt, corrects=corrects)
    push_plan(context, target=target, watermark=wm, interval_end=interval_end, corrects=corrects,
              dry_run=opts.dry_run)
    if isinstance(out, NoOp):
        if corrects is not None:
            waited = time.time() - _started(context)
            if waited < settings.catch_up_after and not opts.dry_run:
                reschedule(settings, f"{out.reason}; waiting for the source's watermark to pass the upper")
            raise AirflowFailException(f"cannot re-process [{corrects[0]}, {corrects[1]}): {out.reason}")
        nothing_to_do(context, out.reason, settings.writers)
    if opts.dry_run:
        dry_run_report(context, settings, lambda spark: _dry_ingest(spark, source, shard, out, settings))
    for d in out:
        log.info("minted description %s [%d, %d)%s for %d writer slots (attempt %d of %d)", d.desc_id, d.lower,
                 d.upper, f" correcting [{d.corrects[0]}, {d.corrects[1]})" if d.corrects else "", settings.writers,
                 attempt, settings.max_attempts)
    return [d.to_dict() for d in out]


def _started(context: dict[str, Any]) -> float:
    started = getattr(context.get("dag_run"), "start_date", None)
    return started.timestamp() if isinstance(started, datetime) else time.time()


def _dry_ingest(spark: Any, source: Any, shard: Shard, descs: list[Description],
                settings: IngestSettings) -> list[dict[str, Any]]:
    from shardsink.spark.dryrun import dry_run_ingest

    return dry_run_ingest(spark, source, shard, descs, slots=settings.writers, sample=settings.sample_rows)


def dry_run_report(context: dict[str, Any], settings: IngestSettings,
                   compute: Callable[[Any], list[dict[str, Any]]]) -> NoReturn:
    """Compute what the run would write on a local Spark session, report it (log + XCom
    ``dry_run``), and end the run's work: nothing is written to the shard."""
    from shardsink.spark.dryrun import local_session, log_line, totals

    spark = local_session(f"shardsink-dry-run-{settings.dag_id}")
    try:
        report = totals(compute(spark))
    finally:
        spark.stop()
    context["ti"].xcom_push(key="dry_run", value=report)
    log.info("%s", log_line(report))
    skip_rest(context, settings.writers)
    raise AssertionError("unreachable")  # pragma: no cover - skip_rest always raises


def _append_one(shard: Shard, d: Description, slots: int, writer: str) -> tuple[AppendResult | None, str | None]:
    try:
        return append_from_manifests(shard, d, 1 if d.corrects else slots, writer=writer), None
    except LostRaceError as e:
        return None, (f"lost the race at shard upper {e.current}: description {d.desc_id} [{d.lower}, {d.upper}) "
                      f"was not committed and its {e.deleted} staged objects were deleted")
    except UpperMismatchError as e:
        return None, (f"description {d.desc_id} [{d.lower}, {d.upper}) cannot commit now (shard upper {e.current}); "
                      "nothing was deleted (its staged parts go with GC once the upper passes it)")


def append_task(settings: IngestSettings, attempt: int, descs: list[dict[str, Any]], context: dict[str, Any],
                asset: Any) -> dict[str, Any]:
    """Commit the attempt's descriptions in order; a lost one is skipped over (its objects deleted).

    A description whose lower is the shard's upper after an earlier one lost (a racing run
    committed exactly the span before it) still commits. Result (XCom and log): the committed
    ranges ``[{desc_id, lower, upper, seqno, rows, status, corrects}]``, the losses, the upper.
    If anything committed, the shard's asset event carries the same (``lower``/``upper`` the
    span of this attempt's commits). Covered target: the rest of the run is skipped. Nothing
    committed: skipped (attempt k+1 retries fresh after a backoff) or, on the last attempt, failed.
    UnknownOutcomeError propagates so that Airflow retries this task, which re-reads.
    """
    if not descs:
        raise AirflowSkipException("no description was minted for this attempt; nothing to append")
    shard = Shard.open(settings.shard_url)
    writer = f"airflow:{settings.dag_id}/{context['dag_run'].run_id}"
    done: list[dict[str, Any]] = []
    lost: list[str] = []
    for raw in descs:
        d = Description.from_dict(raw)
        try:
            r, why = _append_one(shard, d, settings.writers, writer)
        except (CorruptionError, ShardClosedError) as e:
            raise AirflowFailException(str(e)) from e
        if r is None:
            assert why is not None
            log.info("%s", why)
            lost.append(why)
            continue
        log.info("%s: description %s [%d, %d) at seqno %d, %d rows%s", r.status.replace("_", " "), r.desc_id,
                 r.lower, r.upper, r.seqno, r.rows,
                 f" (with the correction of [{d.corrects[0]}, {d.corrects[1]}))" if d.corrects else "")
        done.append({"desc_id": r.desc_id, "lower": r.lower, "upper": r.upper, "seqno": r.seqno, "rows": r.rows,
                     "status": r.status, "corrects": list(d.corrects) if d.corrects else None})
    if done:
        ensure_retention(shard, settings.retention)
        after_commit(settings.source_spec, shard.url)  # reclocked sources publish their resumption frontier
    upper = shard.info().upper
    plan = context["ti"].xcom_pull(task_ids=f"attempt_{attempt}.mint", key="plan") or {}
    result: dict[str, Any] = {"shard": shard.url, "committed": done, "lost": lost, "upper": upper}
    if lost:
        result["retry_at"] = time.time() + settings.backoff(attempt + 1)
    context["ti"].xcom_push(key="return_value", value=result)
    if done:
        context["outlet_events"][asset].extra = {
            "shard": shard.url, "lower": done[0]["lower"], "upper": done[-1]["upper"], "seqno": done[-1]["seqno"],
            "rows": sum(c["rows"] for c in done), "desc_id": done[-1]["desc_id"], "commits": done}
    elif attempt < settings.max_attempts:
        raise AirflowSkipException(f"{lost[-1]}; attempt {attempt + 1} retries with a fresh description")
    else:
        raise AirflowFailException(f"{lost[-1]}; all {settings.max_attempts} attempts lost their races, giving up")
    if covered(settings, context, plan.get("target"), upper=upper) and not (plan.get("corrects") and not any(
            c["corrects"] for c in done)):
        skip_rest(context, settings.writers)
    return result


def report_task(settings: IngestSettings, context: dict[str, Any]) -> dict[str, Any]:
    """The run's account: every range it committed (in order), and the check that makes a green
    run mean "covered": the shard's upper is at least the run's target (``min(interval end,
    watermark)`` as its mints saw it). A dry run reports what it would have written instead."""
    ti = context["ti"]
    commits = [c for r in _earlier(context, settings.max_attempts + 1) for c in r.get("committed", [])]
    plans = [p for k in range(1, settings.max_attempts + 1)
             if isinstance(p := ti.xcom_pull(task_ids=f"attempt_{k}.mint", key="plan"), dict)]
    dry = ti.xcom_pull(task_ids="attempt_1.mint", key="dry_run")
    targets = [p["target"] for p in plans if p.get("target") is not None]
    target = max(targets) if targets else None
    shard = Shard.open(settings.shard_url) if _exists(settings.shard_url) else None
    upper = shard.info().upper if shard is not None else None
    out: dict[str, Any] = {"shard": settings.shard_url, "run_id": context["dag_run"].run_id,
                           "writer": f"airflow:{settings.dag_id}/{context['dag_run'].run_id}",
                           "committed": commits, "target": target, "upper": upper}
    if dry is not None:
        out["dry_run"] = dry
        log.info("dry run: would write %d updates, %d bytes in %d descriptions; nothing was written",
                 dry["updates"], dry["bytes"], dry["descriptions"])
        return out
    for c in commits:
        log.info("committed [%d, %d) as %s at seqno %d (%d rows)%s", c["lower"], c["upper"], c["desc_id"], c["seqno"],
                 c["rows"], f", correcting [{c['corrects'][0]}, {c['corrects'][1]})" if c.get("corrects") else "")
    if not commits:
        log.info("this run committed nothing")
    wanted = [p["corrects"] for p in plans if p.get("corrects")]
    if wanted and not any(c.get("corrects") for c in commits):
        raise AirflowFailException(f"the correction of {wanted[0]} was not committed")
    if target is not None and (upper is None or upper < target):
        raise AirflowFailException(
            f"the run's interval is not covered: shard upper {upper} < target {target} (min of interval end and "
            f"watermark) after {settings.max_attempts} attempts; clear the run to continue")
    log.info("covered: shard upper %s >= target %s", upper, target)
    return out


def _exists(url: str) -> bool:
    from shardsink.errors import ShardNotFoundError

    try:
        Shard.open(url)
        return True
    except ShardNotFoundError:
        return False


class ShardWriteOperator(ShardTaskMixin, SparkSubmitOperator):
    """spark-submit of the write job for one writer slot of a minted description.

    Mapped over the slots; ``desc`` is the mint task's XCom (templated, resolved at run
    time). Ships the library with ``--py-files`` (a zip built by shardsink) and skips
    the JVM entirely when the description is already committed (a retry after success).

    Failures: the job writes a typed outcome record to a per-try result file
    (``--result-path``, :mod:`shardsink.outcome`); after spark-submit fails the operator
    rebuilds the shardsink error from it and applies :func:`shardsink.airflow.failures.for_airflow`
    (invalid input and corruption fail at once; storage errors are retried). No record
    (the JVM or driver died first): the spark-submit failure is raised as is (retried).
    The result file is local to the worker, so the driver must run there (client deploy
    mode); in cluster deploy mode no record arrives and every failure is retried.

    Credentials: ``aws_conn_id`` is resolved by the amazon provider's hook
    (:mod:`shardsink.airflow.credentials`); the committed check uses a client built from
    it, and spark-submit gets it in its process environment only (not ``self.env_vars``,
    which is a rendered template field). YARN and Kubernetes modes would put environment
    variables on the spark-submit command line, so they are refused with credentials.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "desc")
    shard_role = "write"
    #: Whether this operator stages descriptions that carry a re-processing correction.
    stages_corrections = False

    def __init__(self, *, shard_url: str, source_spec: dict[str, Any], slots: int, desc: Any, slot: int,
                 aws_conn_id: str | None = None, **kwargs: Any) -> None:
        from shardsink.spark import job_path

        if "application" not in kwargs:
            kwargs["application"] = job_path()
        super().__init__(**kwargs)
        # Plain values only: mapped operators' partial arguments are serialized.
        self.shard_url = shard_url
        self.source_spec = source_spec
        self.slots = slots
        self.desc = desc
        self.slot = slot
        self.aws_conn_id = aws_conn_id
        self._secret_env: dict[str, str] = {}

    def committed_already(self, d: Description) -> Committed | None:
        """The commit of ``d`` if it landed (then the JVM is skipped). Hook for subclasses."""
        return committed(Shard.open(self.shard_url), d)

    def job_args(self, d: Description) -> list[str]:
        """The application's arguments for description ``d``. Hook for subclasses."""
        import json

        return [
            "--shard-url", self.shard_url, "--source", json.dumps(self.source_spec, sort_keys=True),
            "--desc-id", d.desc_id, "--lower", str(d.lower), "--upper", str(d.upper),
            "--attempt", str(d.attempt), "--slot", str(self.slot), "--slots", str(self.slots),
        ]

    def _get_hook(self) -> Any:
        """The provider's hook, with the connection's credentials added to spark-submit's environment."""
        from shardsink.errors import InvalidUsageError

        hook = super()._get_hook()
        if self._secret_env:
            if hook._is_yarn or hook._is_kubernetes or hook._connection.get("deploy_mode") == "cluster":
                raise AirflowFailException(str(InvalidUsageError(
                    f"aws_conn_id {self.aws_conn_id!r} with Spark master {hook._connection.get('master')!r}: "
                    "credentials can only reach a local or standalone client-mode spark-submit through its "
                    "environment (YARN/Kubernetes would put them on the command line); use instance roles there"
                )))
            # The hook hands _env_vars to Popen(env=...) in local/standalone client mode only.
            hook._env_vars = {**(hook._env_vars or {}), **self._secret_env}
        return hook

    def execute(self, context: Any) -> None:
        import tempfile

        from shardsink.airflow.credentials import store_access
        from shardsink.spark import build_pyfiles_zip

        if not self.desc:
            raise AirflowSkipException("no description was minted for this attempt; nothing to write")
        d = Description.from_dict(self.desc)
        if d.corrects is not None and not self.stages_corrections:
            raise AirflowSkipException("this description carries a correction: its correction job stages it")
        with store_access(self.aws_conn_id) as access:
            done = self.committed_already(d)
            if done is not None:
                self.log.info("description %s is already committed (seqno %d); slot %d has nothing to write",
                              d.desc_id, done.seqno, self.slot)
                return
            self._secret_env = access.spark_env() if access is not None else {}
        env = dict(self.env_vars or {})
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.env_vars = env
        self.py_files = ",".join(p for p in [self.py_files, build_pyfiles_zip()] if p)
        self.name = f"shardsink-{self.dag_id}-slot{self.slot}"
        self.log.info("writing slot %d of %d for description %s [%d, %d)", self.slot, self.slots, d.desc_id,
                      d.lower, d.upper)
        with tempfile.TemporaryDirectory(prefix="shardsink-outcome-") as tmp:
            result = os.path.join(tmp, "outcome.json")  # per try: a fresh folder each execute
            self.application_args = [*self.job_args(d), "--result-path", result]
            try:
                super().execute(context)
            except Exception as e:
                raise self._failure(result, e) from e
            finally:
                self._secret_env = {}
            self._report(result)

    def _failure(self, result: str, spark_error: BaseException) -> BaseException:
        """What to raise after spark-submit failed: decided by the job's outcome record."""
        from shardsink.airflow.failures import for_airflow
        from shardsink.outcome import error_from_record, read_outcome

        outcome = read_outcome(result)
        if outcome is None or outcome.error is None:
            self.log.warning("the write job left no outcome record (it died before reporting); retrying if allowed")
            return spark_error
        rec = outcome.error
        err = error_from_record(rec)
        self.log.error("write job failed: %s (%s): %s%s", rec.error_class, rec.raised, rec.message,
                       f" [value: {rec.value}]" if rec.value is not None else "")
        if err is None:
            return spark_error
        return for_airflow(err)

    def _report(self, result: str) -> None:
        from shardsink.outcome import read_outcome

        outcome = read_outcome(result)
        if outcome is not None and outcome.ok:
            self.log.info("write job outcome: %s", outcome.summary)


def ensure_retention(shard: Shard, retention: str | None) -> None:
    """Set the shard's retention to the DAG's ``retention=`` when it differs (a committed
    state transition; a no-op read otherwise). Best effort after the append: a failure is
    logged and the next run sets it."""
    if retention is None:
        return
    from shardsink import maintenance
    from shardsink.errors import ShardsinkError

    try:
        if maintenance.set_retention(shard, retention, writer="airflow"):
            log.info("retention of %s set to %s", shard.url,
                     maintenance.format_duration(maintenance.parse_duration(retention)))
    except ShardsinkError as e:
        log.warning("retention of %s not set (the next run retries): %s", shard.url, e)
