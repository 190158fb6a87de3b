"""What the two sink DAG factories (``ingest_dag``, ``view_dag``) build the same way, once:
the run's :class:`IngestSettings` and the write operator's arguments from the option
objects (:mod:`shardsink.airflow.options`), the timetable, and the DAG of attempt groups
(:mod:`shardsink.airflow.attempts`).

Everything here runs when a DAG file is parsed: a bad value fails the parse with
:class:`shardsink.errors.InvalidUsageError`, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, DeltaDataIntervalTimetable

from shardsink.airflow.attempts import MakeWrite, MintBody, attempt_groups
from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions
from shardsink.airflow.settings import IngestSettings
from shardsink.errors import InvalidUsageError


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


def timetable(schedule: Any) -> Any:
    """A cron string or timedelta as a data-interval timetable; anything else as is."""
    if isinstance(schedule, str) and not schedule.startswith("@once") and schedule not in ("@continuous",):
        return CronDataIntervalTimetable(schedule, timezone="UTC")
    if isinstance(schedule, timedelta):
        return DeltaDataIntervalTimetable(schedule)
    return schedule


def checked_start_date(factory: str, dag_id: str, start_date: object) -> datetime:
    """``start_date`` of a ``factory(dag_id=...)`` call, in UTC as the DAG will hold it (a naive
    one is in Airflow's ``default_timezone``, as Airflow reads it), or InvalidUsageError naming it.

    Required: it is the start of the DAG's first interval and the initial upper of the shard
    the first run creates. A silent default would start the shard wherever the default lies,
    and every later run would then wait for, and catch up, the empty intervals in between.
    """
    if start_date is None:
        raise InvalidUsageError(
            f"{factory}(dag_id={dag_id!r}) needs start_date=: the start of its first interval and the initial "
            "upper of the shard it creates; give the first day of your data, e.g. "
            "start_date=datetime(2025, 1, 1, tzinfo=UTC)", value="start_date")
    if not isinstance(start_date, datetime):
        raise InvalidUsageError(f"{factory}(dag_id={dag_id!r}): start_date must be a datetime, got "
                                f"{type(start_date).__name__} {start_date!r:.60}", value=repr(start_date)[:60])
    from airflow.sdk import timezone

    return timezone.convert_to_utc(start_date)


def sink_settings(*, dag_id: str, url: str, spec: dict[str, Any], writers: int, start_date: datetime,
                  shard: ShardOptions, attempts: AttemptOptions, spark: SparkOptions) -> IngestSettings:
    """The settings every task of the DAG shares (range-checked by :class:`IngestSettings`)."""
    return IngestSettings(
        dag_id=dag_id,
        shard_url=url,
        source_spec=spec,
        writers=writers,
        max_span=_millis(shard.max_span),
        max_attempts=attempts.max_attempts,
        initial_upper=shard.initial_upper if shard.initial_upper is not None else int(start_date.timestamp() * 1000),
        backoff_base=attempts.backoff,
        backoff_cap=attempts.backoff_cap,
        retention=retention_spec(shard.retention),
        iceberg=bool(shard.iceberg),
        aws_conn_id=shard.aws_conn_id,
        max_chain=attempts.max_chain,
        catch_up_after=attempts.catch_up_after.total_seconds(),
        poke_interval=attempts.poke_interval.total_seconds(),
        max_append_wait=attempts.max_append_wait.total_seconds(),
        connect_conn_id=spark.connect_conn_id if spark.engine == "connect" else None,
    )


def write_args(url: str, spark: SparkOptions, shard: ShardOptions, attempts: AttemptOptions, *,
               default_conf: Mapping[str, str]) -> dict[str, Any]:
    """The write operator's partial arguments both factories pass (``spark.conf`` over ``default_conf``)."""
    return {"shard_url": url, "aws_conn_id": shard.aws_conn_id, "conn_id": spark.conn_id, "engine": spark.engine,
            "connect_conn_id": spark.connect_conn_id,
            "conf": {**default_conf, **(spark.conf or {})}, "env_vars": dict(spark.env or {}),
            "retries": attempts.task_retries, "retry_delay": attempts.task_retry_delay}


#: The weight rule of a sink DAG's tasks, unless the DAG's ``default_args`` names one: Airflow's
#: ``"upstream"``, so a task ranks above the tasks before it (an append above the writes, the writes
#: above the mints), and among equal ranks Airflow queues the earlier logical date first. In a
#: backfill, the earliest interval's writes, which every later append waits for, then go before
#: later intervals' mints and writes, and a resumed append before any write.
#: SUBTLE: Airflow orders tasks only when it queues them, and Celery's broker runs what was queued
#: first in, first out: the order holds only while the scheduler's ``parallelism`` is no larger than
#: the workers' slots (docs/deployment.md, "Task order in a backfill").
WEIGHT_RULE = "upstream"


def sink_dag(settings: IngestSettings, *, asset: Asset, attempts: AttemptOptions, mint_body: MintBody,
             make_write: MakeWrite, **dag_args: Any) -> DAG:
    """The DAG ``settings.dag_id`` (``dag_args``: Airflow's DAG arguments) of attempt groups and the
    report; its tasks' weight rule is :data:`WEIGHT_RULE` unless ``default_args`` names one."""
    dag_args["default_args"] = {"weight_rule": WEIGHT_RULE, **(dag_args.get("default_args") or {})}
    with DAG(dag_id=settings.dag_id, **dag_args) as dag:
        attempt_groups(settings=settings, asset=asset, mint_body=mint_body, make_write=make_write,
                       task_retries=attempts.task_retries, task_retry_delay=attempts.task_retry_delay)
    return dag
