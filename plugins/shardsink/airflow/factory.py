"""``ingest_dag(...)``: a persistence pipeline in a few declarative lines of a DAG file.

Graph of one DAG run (K = ``max_attempts``)::

    attempt_1: mint ─► write[slot 0..N-1] (spark-submit) ─► append
                                                              │ lost the race → skipped
    attempt_2: mint (trigger rule none_failed) ─► write[...] ─► append
    ...
    attempt_K: ...                                            append fails loudly if it loses too

Every attempt is a TaskGroup, so a lost race and its retry are visible in the graph.
``mint`` of attempt k >= 2 runs after a success *or* a skip of append k-1 and decides
from the shard state whether anything is left to do (see tasks.retry_gate). A no-op
(``upper <= lower``) skips every later task: no Spark job, no JVM. The attempt groups
are built by :mod:`shardsink.airflow.attempts`, shared with the materialize sink's
``view_dag`` (:mod:`shardsink.airflow.view_factory`).

Scheduling: a cron string or timedelta becomes a *data-interval* timetable, so a run's
``data_interval_end`` is the end of the period it covers (scheduled and backfill runs:
logical date L covers [L, L+period); ``airflow dags test D L`` covers the period
ending at L). Runs default to ``max_active_runs=1``; concurrent runs are still safe,
they just race (and the losers retry).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, DeltaDataIntervalTimetable

from shardsink.airflow.attempts import attempt_groups
from shardsink.airflow.reprocess import IngestWriteOperator, run_params
from shardsink.airflow.tasks import IngestSettings, mint_task
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Source
from shardsink.storage.url import parse_url


def _millis(span: timedelta | int | None) -> int | None:
    if span is None or isinstance(span, int):
        return span
    return int(span.total_seconds() * 1000)


def retention_spec(retention: timedelta | str | None) -> str | None:
    """The ``retention=`` option as the spec the append task applies (validated now, at
    parse time): None leaves the shard's retention alone; ``"none"`` keeps all history."""
    if retention is None:
        return None
    from shardsink.maintenance import parse_duration

    ms = parse_duration(retention)
    return "none" if ms is None else f"{ms}ms"


def _timetable(schedule: Any) -> Any:
    if isinstance(schedule, str) and not schedule.startswith("@once") and schedule not in ("@continuous",):
        return CronDataIntervalTimetable(schedule, timezone="UTC")
    if isinstance(schedule, timedelta):
        return DeltaDataIntervalTimetable(schedule)
    return schedule


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
    start_date: datetime = datetime(2024, 1, 1, tzinfo=UTC),
    max_span: timedelta | int | None = None,
    spark_conn_id: str = "spark_default",
    spark_conf: Mapping[str, str] | None = None,
    spark_env: Mapping[str, str] | None = None,
    aws_conn_id: str | None = None,
    max_attempts: int = 5,
    retry_backoff: float = 2.0,
    retry_backoff_cap: float = 30.0,
    task_retries: int = 2,
    task_retry_delay: timedelta = timedelta(seconds=30),
    initial_upper: int | None = None,
    max_chain: int = 16,
    catch_up_after: timedelta = timedelta(minutes=5),
    poke_interval: timedelta = timedelta(seconds=15),
    catchup: bool = False,
    max_active_runs: int = 1,
    tags: list[str] | None = None,
    retention: timedelta | str | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the ingest DAG: each run appends one batch ``[shard upper, min(watermark, interval end,
    upper + max_span))`` of ``source`` to the shard at ``shard_url``, exactly once.

    ``writers`` spark-submit jobs stage the batch (slot i reads the source's slot i of N).
    The shard is created on first use from the source's schema with upper
    ``initial_upper`` (default: ``start_date``). ``task_retries`` applies to write and
    append (a retried task never duplicates data); ``max_attempts`` bounds fresh
    descriptions after lost races, with full-jitter backoff ``retry_backoff * 2^(k-2)``
    seconds capped at ``retry_backoff_cap``. Credentials: the standard AWS environment,
    or ``aws_conn_id``, an ``aws`` connection resolved by the amazon provider's hook for every
    task and for spark-submit's environment, never logged or stored
    (:mod:`shardsink.airflow.credentials`).
    ``retention`` (e.g. ``"7d"`` or a timedelta; ``"none"``: all history) is set on the
    shard by the append task when it differs; None leaves it alone.
    """
    if writers < 1 or max_attempts < 1:
        raise InvalidUsageError(f"writers ({writers}) and max_attempts ({max_attempts}) must be at least 1")
    url = str(parse_url(shard_url))
    settings = IngestSettings(
        dag_id=dag_id,
        shard_url=url,
        source_spec=source.spec(),
        writers=writers,
        max_span=_millis(max_span),
        max_attempts=max_attempts,
        initial_upper=initial_upper if initial_upper is not None else int(start_date.timestamp() * 1000),
        backoff_base=retry_backoff,
        backoff_cap=retry_backoff_cap,
        retention=retention_spec(retention),
        aws_conn_id=aws_conn_id,
        max_chain=max_chain,
        catch_up_after=catch_up_after.total_seconds(),
        poke_interval=poke_interval.total_seconds(),
    )
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **(spark_conf or {})}
    common: dict[str, Any] = {"shard_url": url, "source_spec": settings.source_spec, "aws_conn_id": aws_conn_id,
                              "conn_id": spark_conn_id, "conf": conf, "env_vars": dict(spark_env or {}),
                              "retries": task_retries, "retry_delay": task_retry_delay}

    def make_write(descs: Any) -> Any:
        return IngestWriteOperator.partial(task_id="write", slots=writers, **common).expand(
            desc=descs, slot=list(range(writers)))

    with DAG(
        dag_id=dag_id,
        schedule=_timetable(schedule),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        tags=tags or ["shardsink"],
        params=run_params(reprocess=True),
        doc_md=f"Appends `{source.kind}` source batches to shard `{url}` ({writers} writers).",
        **dag_kwargs,
    ) as dag:
        attempt_groups(settings=settings, asset=shard_asset(url), mint_body=mint_task, make_write=make_write,
                       task_retries=task_retries, task_retry_delay=task_retry_delay)
    return dag
