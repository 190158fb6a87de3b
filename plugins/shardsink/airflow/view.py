"""The materialize sink's Airflow pieces: the mint task body and the write operator.

The graph is the ingest sink's (see :mod:`shardsink.airflow.factory`): per attempt a
``mint`` → ``write`` (ONE spark-submit: the correction is a single Spark job) →
``append`` TaskGroup, fresh descriptions after lost races, and the output shard's asset
event on success. Only mint and write differ; append is the ingest sink's, unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from shardsink.airflow.gates import nothing_to_do, retry_gate
from shardsink.airflow.results import MintTarget
from shardsink.airflow.run_context import push_target, run_options
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.tasks import dry_run_report
from shardsink.airflow.write_operator import ShardWriteOperator
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError, ShardNotFoundError
from shardsink.sinks.description import Description, NoOp, to_builtins
from shardsink.sinks.ingest import Committed, committed
from shardsink.sinks.materialize import View, input_frontiers, mint_view
from shardsink.spark.request import JobRequest, ViewWriteRequest

log = logging.getLogger("shardsink.airflow")

def mint_view_task(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Mint attempt ``attempt``'s description of the view (a chain of one), or skip the rest of the run.

    ``settings.source_spec`` is the view spec. The run's target is ``min(interval end, input
    uppers)``; the run continues with further attempts until its output upper reaches it
    (each description at most ``max_span`` wide: a view's correction for ``[l, u)`` reads
    the output as of ``l - 1``, so descriptions of one view run cannot be staged in
    parallel). Reads the output's head and each input's head once. Bad input (a missing input
    shard, an input compacted past the view's time) fails the task without Airflow retries:
    retrying cannot fix it. ``dry_run``: compute and report the correction, write nothing.
    """
    try:
        opts = run_options(context)
    except InvalidUsageError as e:
        raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    retry_gate(settings, attempt, context)
    v = View.from_spec(settings.source_spec)
    _, interval_end = opts.interval
    try:
        frontiers = input_frontiers(v)
        out = mint_view(v, output_url=settings.shard_url, initial_upper=settings.initial_upper,
                        interval_end=interval_end, max_span=settings.max_span, dag_id=settings.dag_id,
                        run_id=context["dag_run"].run_id, attempt=attempt, frontiers=frontiers)
    except InvalidUsageError as e:
        raise AirflowFailException(f"{type(e).__name__}: {e}") from e
    uppers = [f.upper for f in frontiers if f.upper is not None]
    bounds = [b for b in (min(uppers) if uppers else None, interval_end) if b is not None]
    push_target(context, MintTarget(target=min(bounds) if bounds else None, interval_end=interval_end,
                                    dry_run=opts.dry_run))
    if isinstance(out, NoOp):
        nothing_to_do(context, out.reason, settings.writers)
    if opts.dry_run:
        from shardsink.spark.dryrun import dry_run_view

        desc = out
        dry_run_report(context, settings, lambda spark: [dry_run_view(
            spark, v, output_url=settings.shard_url, desc=desc, sample=settings.sample_rows)])
    log.info("minted view description %s [%d, %d) (attempt %d of %d; %d triggering asset events, all "
             "covered by this run)", out.desc_id, out.lower, out.upper, attempt, settings.max_attempts,
             _count_events(context))
    return [to_builtins(out)]


def _count_events(context: dict[str, Any]) -> int:
    """How many asset events triggered this run (for the log only; never fails the task)."""
    try:
        events = context.get("triggering_asset_events") or {}
        return sum(len(list(evs)) for evs in events.values())
    except Exception:
        return 0


class ViewWriteOperator(ShardWriteOperator):
    """spark-submit of the view write job (``spark_jobs/view_write.py``) for a minted description.

    The ingest write operator with two differences: the output shard may not exist yet
    (the first write creates it), and the job gets the view spec. Failures are decided
    from the job's outcome record as for ingest (invalid input, e.g. a bad query or a
    schema change the output cannot evolve to, fails without Airflow retries; a query that gains
    a column or widens a type evolves the output shard in the job, see
    :mod:`shardsink.spark.view_schema`).
    """

    def __init__(self, *, view_spec: dict[str, Any], **kwargs: Any) -> None:
        from shardsink.spark import view_job_path

        if "application" not in kwargs:
            kwargs["application"] = view_job_path()
        super().__init__(source_spec=view_spec, slots=1, **kwargs)

    def committed_already(self, d: Description) -> Committed | None:
        """The task's one head read of the output (no output shard yet: not committed): the fate
        is decided from it, and its seqno goes to the job (``decided_at``)."""
        shard = Shard(self.shard_url)
        try:
            head = shard.reader().head()
        except ShardNotFoundError:
            return None
        self._decided_at = head.seqno
        return committed(shard, d, head=head)

    def job_request(self, d: Description) -> JobRequest:
        return ViewWriteRequest(shard_url=self.shard_url, view=dict(self.source_spec), desc=d,
                                decided_at=self._decided_at)
