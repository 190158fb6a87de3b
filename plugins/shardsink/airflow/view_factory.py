"""``view_dag(...)``: a self-correcting materialized view in a few declarative lines of a DAG file.

Each run appends ONE batch ``[output upper, min(input uppers, interval end, output upper +
max_span))`` holding ``desired - persisted`` (see :mod:`shardsink.sinks.materialize`),
through the same attempt TaskGroups as the ingest DAG (:mod:`shardsink.airflow.attempts`).

Scheduling (``schedule=``):

* ``"inputs"`` (default): on the input shards' assets (any of them; the ingest DAG's
  append emits one per committed batch, see :func:`shard_asset`). Airflow may coalesce
  several input events into one run; that is fine: a run processes everything
  available (upper = min input uppers), so one run covers all of them, and a run
  whose inputs did not all advance is a no-op skip (no JVM).
* a cron string or timedelta: a data-interval timetable, as in the ingest DAG; the
  run's interval end also bounds the batch (a backfill of day D computes the view as
  of the end of D);
* :class:`~shardsink.airflow.partitions.InputPartitions` (e.g. ``InputPartitions(period="daily")``):
  one run per partition of its inputs (Airflow 3.2+ partitioned asset scheduling, all inputs
  having an event for the key); the run's interval is the one its key names, so it bounds
  the batch as a data interval does. Inputs written by a partition-scheduled ingest DAG need
  it: Airflow does not queue non-partitioned DAGs (``"inputs"``) on events that carry a
  partition key. A ``PartitionedAssetTimetable`` of your own works too if its mappers are
  temporal (``StartOfDayMapper``, ...);
* anything else Airflow accepts (``None``, assets, timetables), passed through.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from airflow.sdk import DAG, AssetAny

from shardsink.airflow.build import checked_start_date, sink_dag, sink_settings, timetable, write_args
from shardsink.airflow.deprecated import VIEW_ALIASES, with_flat_aliases
from shardsink.airflow.factory import shard_asset
from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions
from shardsink.airflow.partitions import InputPartitions
from shardsink.airflow.reprocess import run_params
from shardsink.airflow.view import ViewWriteOperator, mint_view_task
from shardsink.errors import InvalidUsageError
from shardsink.sinks.materialize import View
from shardsink.storage.url import parse_url

#: The default Spark settings of a view job (UTC: views over ``_time`` bucket by UTC days).
VIEW_SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                   "spark.sql.session.timeZone": "UTC"}


def view_schedule(v: View, schedule: Literal["inputs"] | InputPartitions | Any) -> Any:
    """What ``schedule=`` becomes (see the module docstring)."""
    if isinstance(schedule, InputPartitions):
        return schedule.timetable([shard_asset(i.url) for i in v.inputs.values()])
    if schedule == "inputs":
        assets = [shard_asset(i.url) for i in v.inputs.values()]
        return assets if len(assets) == 1 else AssetAny(*assets)
    return timetable(schedule)


def view_dag(
    *,
    dag_id: str,
    output_url: str,
    view: View,
    schedule: Literal["inputs"] | InputPartitions | Any = "inputs",
    start_date: datetime | None = None,
    spark: SparkOptions | None = None,
    shard: ShardOptions | None = None,
    attempts: AttemptOptions | None = None,
    catchup: bool = False,
    max_active_runs: int = 1,
    tags: list[str] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the view DAG: each run makes the output shard at ``output_url`` hold ``view``'s
    contents as of its new upper - 1, writing only the difference.

    ``start_date`` is required, as for ``ingest_dag``: the output shard is created by the first
    write from the query's schema with upper ``shard.initial_upper`` (default: ``start_date``).
    A query that later gains a column or
    widens a type evolves the output's schema (one full comparison); any other change fails
    its write without retries, naming the column and the ``shardsink schema`` command that
    fixes it, the shard unchanged (:mod:`shardsink.spark.view_schema`). The option
    objects (``spark``, ``shard``, ``attempts``) and their deprecated flat keywords work as
    in :func:`shardsink.airflow.ingest_dag` (a view run mints one description and never
    waits for earlier intervals: ``max_chain``, ``catch_up_after`` and ``poke_interval``
    do not apply).
    """
    spark, shard, attempts = with_flat_aliases("view_dag", VIEW_ALIASES, dag_kwargs, spark=spark, shard=shard,
                                               attempts=attempts)
    start_date = checked_start_date("view_dag", dag_id, start_date)
    if attempts.max_attempts < 1:
        raise InvalidUsageError(f"max_attempts ({attempts.max_attempts}) must be at least 1")
    url = str(parse_url(output_url))
    if any(i.url == url for i in view.inputs.values()):
        raise InvalidUsageError(f"view output {url} is also one of its inputs")
    if shard.checked_part_order(default="sorted") != "sorted":
        raise InvalidUsageError(f"part_order {shard.part_order!r}: a view's output keeps sorted parts "
                                "(its corrections are small and read back by every later run)",
                                value=str(shard.part_order))
    settings = sink_settings(dag_id=dag_id, url=url, spec=view.spec(), writers=1, start_date=start_date,
                             shard=shard, attempts=attempts, spark=spark)
    common = write_args(url, spark, shard, attempts, default_conf=VIEW_SPARK_CONF)

    def make_write(desc: Any) -> Any:
        return ViewWriteOperator.partial(task_id="write", view_spec=settings.source_spec, **common).expand(
            desc=desc, slot=[0])

    names = ", ".join(f"`{n}` = `{i.url}`" for n, i in view.inputs.items())
    return sink_dag(
        settings, asset=shard_asset(url), attempts=attempts, mint_body=mint_view_task, make_write=make_write,
        schedule=view_schedule(view, schedule),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        tags=tags or ["shardsink", "view"],
        params=run_params(reprocess=False),
        doc_md=f"Self-correcting view ({view.kind}) over {names} into shard `{url}`.",
        **dag_kwargs,
    )
