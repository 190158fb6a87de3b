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
from datetime import datetime
from typing import Any, NoReturn

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, DownstreamTasksSkipped

from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, ShardClosedError
from shardsink.provider.operators import ShardTaskMixin
from shardsink.reclock.source import after_commit
from shardsink.sinks.ingest import (
    Committed,
    Description,
    LostRaceError,
    NoOp,
    append_from_manifests,
    committed,
    mint,
    open_or_create,
)
from shardsink.sources.base import source_from_spec

log = logging.getLogger("shardsink.airflow")


@dataclass(frozen=True)
class IngestSettings:
    """Everything the tasks of one sink DAG share (static, set by the DAG file).

    For a materialize (view) DAG ``source_spec`` holds the view spec and ``writers`` is 1.
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

    def backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff before attempt ``attempt`` (>= 2)."""
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 2)))


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def skip_rest(context: dict[str, Any], writers: int) -> None:
    """End the run here: mark every downstream task skipped, this one succeeds.

    Faster than letting later attempts run only to skip themselves (each costs a
    scheduling round). Raises DownstreamTasksSkipped, so push XComs before calling.

    SUBTLE: a mapped write's instances (map_index 0..writers-1) must be named one by
    one; naming the task id alone skips only its unexpanded placeholder. If the
    scheduler expands them after this skip anyway, the write operator skips itself
    because its description XCom is absent.
    """
    rest: list[str | tuple[str, int]] = []
    for t in context["task"].get_flat_relatives(upstream=False):
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


def retry_gate(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> None:
    """Return if attempt ``attempt`` must mint a fresh description; else skip the rest of the run.

    Attempt k >= 2 decides from the SHARD STATE, not from what attempt k-1 reported:
    skip if attempt k-1 minted nothing or its description is committed; otherwise it
    lost its race, so back off (jittered) and return. Attempt 1 always passes. Shared
    by the ingest and the materialize sink.
    """
    if attempt <= 1:
        return
    prev = context["ti"].xcom_pull(task_ids=f"attempt_{attempt - 1}.mint")
    if not prev:
        nothing_to_do(context, f"attempt {attempt - 1} had nothing to write; no retry needed", settings.writers)
    prev_desc = Description.from_dict(prev)
    done = committed(Shard.open(settings.shard_url), prev_desc)
    if done is not None:
        nothing_to_do(context, f"attempt {attempt - 1} committed {prev_desc.desc_id} at seqno {done.seqno}; "
                               "no retry needed", settings.writers)
    pause = settings.backoff(attempt)
    log.info("attempt %d lost its race (description %s was not committed); minting afresh after %.2fs",
             attempt - 1, prev_desc.desc_id, pause)
    settings.sleep(pause)


def mint_task(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> dict[str, Any]:
    """Mint attempt ``attempt``'s description, or skip the rest of the attempt (with the reason).

    Attempt k >= 2 first passes :func:`retry_gate`, then mints afresh from the shard's
    new upper.
    """
    retry_gate(settings, attempt, context)
    run_id = context["dag_run"].run_id
    source = source_from_spec(settings.source_spec)
    interval_end = _millis(context.get("data_interval_end")) or _millis(context.get("logical_date"))
    shard = open_or_create(settings.shard_url, source, initial_upper=settings.initial_upper)
    out = mint(shard, source, interval_end=interval_end, max_span=settings.max_span, dag_id=settings.dag_id,
               run_id=run_id, attempt=attempt)
    if isinstance(out, NoOp):
        nothing_to_do(context, out.reason, settings.writers)
    log.info("minted description %s [%d, %d) for %d writer slots (attempt %d of %d)",
             out.desc_id, out.lower, out.upper, settings.writers, attempt, settings.max_attempts)
    return out.to_dict()


def append_task(settings: IngestSettings, attempt: int, desc: dict[str, Any], context: dict[str, Any],
                asset: Any) -> dict[str, Any]:
    """Verify the manifests and commit; on a lost race skip (or fail on the last attempt).

    Success (also *already committed*: an earlier try landed but its answer was lost)
    emits the shard's asset event with extra = shard, lower, upper, seqno, rows.
    UnknownOutcomeError propagates so that Airflow retries this task, which re-reads.
    """
    if not desc:
        raise AirflowSkipException("no description was minted for this attempt; nothing to append")
    d = Description.from_dict(desc)
    shard = Shard.open(settings.shard_url)
    writer = f"airflow:{settings.dag_id}/{context['dag_run'].run_id}"
    try:
        r = append_from_manifests(shard, d, settings.writers, writer=writer)
    except LostRaceError as e:
        msg = (f"lost the race at shard upper {e.current}: description {d.desc_id} [{d.lower}, {d.upper}) "
               f"was not committed and its {e.deleted} staged objects were deleted")
        if attempt < settings.max_attempts:
            raise AirflowSkipException(f"{msg}; attempt {attempt + 1} retries with a fresh description") from e
        raise AirflowFailException(f"{msg}; all {settings.max_attempts} attempts lost their races, giving up") from e
    except (CorruptionError, ShardClosedError) as e:
        raise AirflowFailException(str(e)) from e
    log.info("%s: description %s [%d, %d) at seqno %d, %d rows", r.status.replace("_", " "), r.desc_id,
             r.lower, r.upper, r.seqno, r.rows)
    ensure_retention(shard, settings.retention)
    extra = {"shard": shard.url, "lower": r.lower, "upper": r.upper, "seqno": r.seqno, "rows": r.rows,
             "desc_id": r.desc_id}
    after_commit(settings.source_spec, shard.url)  # reclocked sources publish their resumption frontier
    context["outlet_events"][asset].extra = extra
    result = {"status": r.status, **extra}
    context["ti"].xcom_push(key="return_value", value=result)
    skip_rest(context, settings.writers)
    return result


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
