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
* anything else Airflow accepts (``None``, assets, timetables), passed through.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from airflow.sdk import DAG, AssetAny

from shardsink.airflow.attempts import attempt_groups
from shardsink.airflow.factory import _millis, _timetable, retention_spec, shard_asset
from shardsink.airflow.reprocess import run_params
from shardsink.airflow.tasks import IngestSettings
from shardsink.airflow.view import ViewWriteOperator, mint_view_task
from shardsink.errors import InvalidUsageError
from shardsink.sinks.materialize import View
from shardsink.storage.url import parse_url

#: The default Spark settings of a view job (UTC: views over ``_time`` bucket by UTC days).
VIEW_SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                   "spark.sql.session.timeZone": "UTC"}


def view_schedule(v: View, schedule: Literal["inputs"] | Any) -> Any:
    """What ``schedule=`` becomes (see the module docstring)."""
    if schedule == "inputs":
        assets = [shard_asset(i.url) for i in v.inputs.values()]
        return assets if len(assets) == 1 else AssetAny(*assets)
    return _timetable(schedule)


def view_dag(
    *,
    dag_id: str,
    output_url: str,
    view: View,
    schedule: Literal["inputs"] | Any = "inputs",
    start_date: datetime = datetime(2024, 1, 1, tzinfo=UTC),
    max_span: timedelta | int | None = None,
    initial_upper: int | None = None,
    spark_conn_id: str = "spark_default",
    spark_conf: Mapping[str, str] | None = None,
    spark_env: Mapping[str, str] | None = None,
    aws_conn_id: str | None = None,
    max_attempts: int = 5,
    retry_backoff: float = 2.0,
    retry_backoff_cap: float = 30.0,
    task_retries: int = 2,
    task_retry_delay: timedelta = timedelta(seconds=30),
    catchup: bool = False,
    max_active_runs: int = 1,
    tags: list[str] | None = None,
    retention: timedelta | str | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the view DAG: each run makes the output shard at ``output_url`` hold ``view``'s
    contents as of its new upper - 1, writing only the difference.

    The output shard is created by the first write from the query's schema with upper
    ``initial_upper`` (default: ``start_date``); its schema is fixed from then on (a
    changed query fails its write with a clear message, the shard unchanged). Retries,
    backoff, credentials and ``retention`` work as in :func:`shardsink.airflow.ingest_dag`.
    """
    if max_attempts < 1:
        raise InvalidUsageError(f"max_attempts ({max_attempts}) must be at least 1")
    url = str(parse_url(output_url))
    if any(i.url == url for i in view.inputs.values()):
        raise InvalidUsageError(f"view output {url} is also one of its inputs")
    settings = IngestSettings(
        dag_id=dag_id,
        shard_url=url,
        source_spec=view.spec(),
        writers=1,
        max_span=_millis(max_span),
        max_attempts=max_attempts,
        initial_upper=initial_upper if initial_upper is not None else int(start_date.timestamp() * 1000),
        backoff_base=retry_backoff,
        backoff_cap=retry_backoff_cap,
        retention=retention_spec(retention),
        aws_conn_id=aws_conn_id,
    )
    conf = {**VIEW_SPARK_CONF, **(spark_conf or {})}

    def make_write(desc: Any) -> Any:
        return ViewWriteOperator.partial(
            task_id="write", shard_url=url, view_spec=settings.source_spec, aws_conn_id=aws_conn_id,
            conn_id=spark_conn_id, conf=conf, env_vars=dict(spark_env or {}), retries=task_retries,
            retry_delay=task_retry_delay,
        ).expand(desc=desc, slot=[0])

    names = ", ".join(f"`{n}` = `{i.url}`" for n, i in view.inputs.items())
    with DAG(
        dag_id=dag_id,
        schedule=view_schedule(view, schedule),
        start_date=start_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        tags=tags or ["shardsink", "view"],
        params=run_params(reprocess=False),
        doc_md=f"Self-correcting view ({view.kind}) over {names} into shard `{url}`.",
        **dag_kwargs,
    ) as dag:
        attempt_groups(settings=settings, asset=shard_asset(url), mint_body=mint_view_task, make_write=make_write,
                       task_retries=task_retries, task_retry_delay=task_retry_delay)
    return dag
