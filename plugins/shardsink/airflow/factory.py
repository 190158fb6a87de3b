"""``ingest_dag(...)``: a persistence pipeline in a few declarative lines of a DAG file.

Graph of one DAG run (K = ``max_attempts``)::

    attempt_1: mint ─► write[slot 0..N-1] (spark-submit) ─► append
                                                              │ lost the race → skipped
    attempt_2: mint (trigger rule none_failed) ─► write[...] ─► append
    ...
    attempt_K: ...                                            append fails loudly if it loses too

Every attempt is a TaskGroup, so a lost race and its retry are visible in the graph.
``mint`` of attempt k >= 2 runs after a success *or* a skip of append k-1 and decides
from the shard state whether anything is left to do (see gates.retry_gate). A no-op
(``upper <= lower``) skips every later task: no Spark job, no JVM. The attempt groups
are built by :mod:`shardsink.airflow.attempts`, shared with the materialize sink's
``view_dag`` (:mod:`shardsink.airflow.view_factory`).

Scheduling: a cron string or timedelta becomes a *data-interval* timetable, so a run's
``data_interval_end`` is the end of the period it covers (scheduled and backfill runs:
logical date L covers [L, L+period); ``airflow dags test D L`` covers the period
ending at L). Runs default to ``max_active_runs=1``; concurrent runs are still safe,
they just race (and the losers retry).

Partitioned runs (Airflow 3.2+): ``schedule=daily_partitions()`` / ``hourly_partitions()``
or any ``CronPartitionTimetable`` makes one run per partition key; the run covers the
interval its key names (:mod:`shardsink.airflow.partitions`), with the same guarantees as
an interval run, and its asset events carry the key. A backfill over partitions (``airflow
backfill create``) and a manual run with a key (REST API ``partition_key``) too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset

from shardsink.airflow.build import checked_start_date, sink_dag, sink_settings, timetable, write_args
from shardsink.airflow.deprecated import INGEST_ALIASES, with_flat_aliases
from shardsink.airflow.evolving import evolving_mint_task
from shardsink.airflow.options import AttemptOptions, SchemaMode, ShardOptions, SparkOptions, checked_schema_mode
from shardsink.airflow.partitions import check_partition_schedule
from shardsink.airflow.reprocess import IngestWriteOperator, run_params
from shardsink.airflow.tasks import mint_task
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Source
from shardsink.sources.evolution import file_schemas_of
from shardsink.storage.url import parse_url

#: The default Spark settings of an ingest write job (``SparkOptions.conf`` is added over them).
INGEST_SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}


def shard_asset(shard_url: str) -> Asset:
    """The Airflow asset of a shard (name and URI are the normalised shard URL).

    Its ``extra`` names the shard's page in the Airflow UI (the Shards page of
    :mod:`shardsink.provider`), shown on the asset's page.
    """
    from shardsink.provider.links import page_path

    url = str(parse_url(shard_url))
    return Asset(name=url, uri=url, extra={"shardsink_page": page_path(url)})


def ingest_dag(
    *,
    dag_id: str,
    shard_url: str,
    source: Source,
    writers: int = 2,
    schedule: Any = "@daily",
    start_date: datetime | None = None,
    spark: SparkOptions | None = None,
    shard: ShardOptions | None = None,
    attempts: AttemptOptions | None = None,
    catchup: bool = False,
    max_active_runs: int = 1,
    tags: list[str] | None = None,
    schema_mode: SchemaMode = "strict",
    **dag_kwargs: Any,
) -> DAG:
    """Build the ingest DAG: each run appends one batch ``[shard upper, min(watermark, interval end,
    upper + max_span))`` of ``source`` to the shard at ``shard_url``, exactly once.

    ``writers`` spark-submit jobs stage the batch (slot i reads the source's slot i of N).
    ``start_date`` is required (InvalidUsageError naming it when missing): the start of the
    first interval, and the upper a new shard starts at (the first day of your data). The shard
    is created on first use from the source's schema with upper ``shard.initial_upper``
    (default: ``start_date``); a run whose interval lies more than ``max_chain`` batches past a
    new shard's upper says so in its mint's log and XCom (:func:`shardsink.airflow.gates.far_behind`),
    naming both settings. The option objects
    (:mod:`shardsink.airflow.options`): ``spark`` how spark-submit runs, ``shard`` the
    shard's credentials (``aws_conn_id``), initial upper, ``max_span``, ``retention`` and
    ``part_order`` (default ``"unordered"``: stage parts without sorting them; ``"sorted"``),
    ``attempts`` the fresh attempts after lost races, their backoff, the tasks' retries and
    catching up. Their former flat keywords (``max_span=``, ``spark_conf=``, ...) still work
    for one release, with a ``FlatOptionWarning`` (:mod:`shardsink.airflow.deprecated`).
    Any other keyword goes to Airflow's ``DAG``.

    ``schema_mode`` (as delta-rs's): ``"strict"`` (default) refuses a source file whose columns
    differ from the shard's, in the write job, naming the file and its missing and unexpected
    columns (nothing commits); ``"add_columns"`` evolves the shard in the mint, before anything
    is written, to hold every file the write jobs read: new columns are added nullable, types
    widen (int8 -> ... -> int64, float -> double, decimal precision up, string -> large_string),
    older files read nulls for the columns they lack; anything else fails the run at once,
    naming the file and the column (:mod:`shardsink.sources.evolution`). Needs a file source
    (``LandingSource``, ``FileArrivals``). Re-processing runs evolve and read alike (the
    correction job gets the mode); a dry run evolves nothing and reports the changes it would make.

    ``schedule``: a cron string or timedelta (a data-interval timetable), a partition
    timetable (:func:`shardsink.airflow.daily_partitions`; its keys must decode back to their
    partitions, checked now: a bad one fails the parse), or anything else Airflow accepts.
    """
    spark, shard, attempts = with_flat_aliases("ingest_dag", INGEST_ALIASES, dag_kwargs, spark=spark, shard=shard,
                                               attempts=attempts)
    start_date = checked_start_date("ingest_dag", dag_id, start_date)
    if writers < 1 or attempts.max_attempts < 1:
        raise InvalidUsageError(f"writers ({writers}) and max_attempts ({attempts.max_attempts}) must be at least 1")
    url = str(parse_url(shard_url))
    check_partition_schedule(schedule, start_date=start_date)
    settings = sink_settings(dag_id=dag_id, url=url, spec=source.spec(), writers=writers, start_date=start_date,
                             shard=shard, attempts=attempts, spark=spark)
    common = write_args(url, spark, shard, attempts, default_conf=INGEST_SPARK_CONF)
    part_order = shard.checked_part_order()
    mode = checked_schema_mode(schema_mode)
    if mode != "strict":
        file_schemas_of(source)  # InvalidUsageError naming a source that cannot tell its files' schemas

    def make_write(descs: Any) -> Any:
        return IngestWriteOperator.partial(task_id="write", slots=writers, source_spec=settings.source_spec,
                                           part_order=part_order, schema_mode=mode,
                                           **common).expand(desc=descs, slot=list(range(writers)))

    return sink_dag(
        settings, asset=shard_asset(url), attempts=attempts, make_write=make_write,
        mint_body=mint_task if mode == "strict" else evolving_mint_task,
        schedule=timetable(schedule),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        tags=tags or ["shardsink"],
        params=run_params(reprocess=True),
        doc_md=f"Appends `{source.kind}` source batches to shard `{url}` ({writers} writers).",
        **dag_kwargs,
    )
