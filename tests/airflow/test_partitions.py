"""Partitioned runs: the interval a partition key names (:mod:`shardsink.airflow.partitions`).

No scheduler, no Spark: Airflow's own timetables and mappers (SDK objects, as a DAG file
builds them) decode the keys; the DAG objects are only built. The runs themselves are
tested under a real scheduler (tests/topology/test_partitions.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import (
    Asset,
    CronDataIntervalTimetable,
    CronPartitionTimetable,
    IdentityMapper,
    PartitionedAssetTimetable,
    PartitionedAtRuntime,
    RollupMapper,
    StartOfDayMapper,
    StartOfMonthMapper,
    WeekWindow,
)

from shardsink.airflow import InputPartitions, daily_partitions, hourly_partitions, ingest_dag, view_dag
from shardsink.airflow.partitions import partition_interval
from shardsink.airflow.run_context import interval_of, run_options
from shardsink.errors import InvalidUsageError
from shardsink.sinks.materialize import view
from shardsink.sources import LandingSource

HOUR = 3_600_000
DAY = 24 * HOUR
START = datetime(2024, 1, 1, tzinfo=UTC)


def ms(*args: int, tz: Any = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc, arg-type]


def test_a_daily_key_names_exactly_its_day() -> None:
    assert partition_interval(daily_partitions(), "2024-01-02") == (ms(2024, 1, 2), ms(2024, 1, 3))
    assert partition_interval(daily_partitions(), "2024-02-29") == (ms(2024, 2, 29), ms(2024, 3, 1))


def test_an_hourly_key_names_exactly_its_hour() -> None:
    assert partition_interval(hourly_partitions(), "2024-01-02T23") == (ms(2024, 1, 2, 23), ms(2024, 1, 3))


def test_a_daily_key_in_a_local_timezone_names_the_local_day() -> None:
    lower, upper = partition_interval(daily_partitions(timezone="Asia/Taipei"), "2024-01-02")
    assert (lower, upper) == (ms(2024, 1, 1, 16), ms(2024, 1, 2, 16))  # UTC+8 midnight to midnight


def test_a_key_of_airflows_default_format_names_the_cron_period() -> None:
    tt = CronPartitionTimetable("0 */6 * * *", timezone="UTC")  # key_format %Y-%m-%dT%H:%M:%S
    assert partition_interval(tt, "2024-01-02T06:00:00") == (ms(2024, 1, 2, 6), ms(2024, 1, 2, 12))


@pytest.mark.parametrize("key", ["2024-1-2", "2024-01-02T05", "yesterday", "2024-13-01", " 2024-01-02"])
def test_a_key_that_is_not_a_partition_is_refused_naming_it_and_the_format(key: str) -> None:
    with pytest.raises(InvalidUsageError) as e:
        partition_interval(daily_partitions(), key)
    assert repr(key) in str(e.value) and "%Y-%m-%d" in str(e.value) and "nothing was written" in str(e.value)
    assert e.value.value == key


def test_an_off_tick_key_is_refused() -> None:
    tt = CronPartitionTimetable("0 */6 * * *", timezone="UTC", key_format="%Y-%m-%dT%H")
    with pytest.raises(InvalidUsageError, match="is not a partition of the DAG's timetable"):
        partition_interval(tt, "2024-01-02T05")


@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_key_is_refused(key: str) -> None:
    with pytest.raises(InvalidUsageError, match="non-empty"):
        partition_interval(daily_partitions(), key)


def test_keys_without_an_interval_are_refused() -> None:
    with pytest.raises(InvalidUsageError, match="not partitioned"):
        partition_interval(CronDataIntervalTimetable("@daily", timezone="UTC"), "2024-01-02")
    with pytest.raises(InvalidUsageError, match="PartitionedAtRuntime"):
        partition_interval(PartitionedAtRuntime(), "2024-01-02")
    identity = PartitionedAssetTimetable(assets=Asset("file:///a"), default_partition_mapper=IdentityMapper())
    with pytest.raises(InvalidUsageError, match="gives keys no time"):
        partition_interval(identity, "2024-01-02")


def test_a_view_run_per_input_partition_covers_the_key_of_every_input() -> None:
    tt = InputPartitions(period="daily").timetable([Asset("file:///a"), Asset("file:///b")])
    assert partition_interval(tt, "2024-01-02") == (ms(2024, 1, 2), ms(2024, 1, 3))
    hourly = InputPartitions(period="hourly").timetable([Asset("file:///a")])
    assert partition_interval(hourly, "2024-01-02T05") == (ms(2024, 1, 2, 5), ms(2024, 1, 2, 6))
    with pytest.raises(InvalidUsageError, match="canonical form"):
        partition_interval(tt, "2024-1-02")
    with pytest.raises(InvalidUsageError):
        InputPartitions(period="weekly")  # type: ignore[arg-type]


def test_mappers_of_airflow_name_their_periods_and_must_agree() -> None:
    monthly = PartitionedAssetTimetable(assets=Asset("file:///a"), default_partition_mapper=RollupMapper(
        upstream_mapper=StartOfMonthMapper(input_format="%Y-%m-%d"), window=WeekWindow()))
    assert partition_interval(monthly, "2024-02") == (ms(2024, 2, 1), ms(2024, 3, 1))
    a, b = Asset("file:///a"), Asset("file:///b")
    mixed = PartitionedAssetTimetable(assets=a & b, partition_mapper_config={
        a: StartOfDayMapper(), b: StartOfDayMapper(timezone="Asia/Taipei")})
    with pytest.raises(InvalidUsageError, match="different intervals"):
        partition_interval(mixed, "2024-01-02")


def _context(dag: Any, key: str | None, **extra: Any) -> dict[str, Any]:
    run = SimpleNamespace(partition_key=key, conf={}, run_id="r", dag_id=dag.dag_id, start_date=None)
    return {"dag": dag, "dag_run": run, "params": {}, **extra}


def test_a_partitioned_ingest_run_covers_the_interval_its_key_names(tmp_path: Path) -> None:
    dag = ingest_dag(dag_id="pt_ingest", shard_url=(tmp_path / "shard").as_uri(), schedule=daily_partitions(),
                     start_date=START, source=LandingSource(str(tmp_path / "landing"), time_column="event_time"))
    # A data interval the run may carry does not matter: the key names the interval.
    ctx = _context(dag, "2024-01-02", data_interval_start=datetime(2030, 1, 1, tzinfo=UTC),
                   data_interval_end=datetime(2030, 1, 2, tzinfo=UTC))
    assert interval_of(ctx) == (ms(2024, 1, 2), ms(2024, 1, 3))
    assert interval_of({**ctx, "partition_key": "2024-01-03"}) == (ms(2024, 1, 3), ms(2024, 1, 4))
    with pytest.raises(InvalidUsageError, match="'2024-01-02T00'"):
        run_options(_context(dag, "2024-01-02T00"))  # the mints fail on it before anything is written
    plain = ingest_dag(dag_id="plain", shard_url=(tmp_path / "shard").as_uri(), schedule="@daily", start_date=START,
                       source=LandingSource(str(tmp_path / "landing"), time_column="event_time"))
    ctx = _context(plain, None, data_interval_start=datetime(2024, 1, 2, tzinfo=UTC),
                   data_interval_end=datetime(2024, 1, 3, tzinfo=UTC))
    assert interval_of(ctx) == (ms(2024, 1, 2), ms(2024, 1, 3))  # interval runs as before
    with pytest.raises(InvalidUsageError, match="not partitioned"):
        interval_of(_context(plain, "2024-01-02"))


def test_a_partitioned_view_run_covers_the_interval_its_key_names(tmp_path: Path) -> None:
    dag = view_dag(dag_id="pt_view", output_url=(tmp_path / "out").as_uri(), schedule=InputPartitions(),
                   start_date=START,
                   view=view(inputs={"events": (tmp_path / "shard").as_uri()}, sql="SELECT * FROM events"))
    assert type(dag.timetable).__name__ == "PartitionedAssetTimetable"
    assert interval_of(_context(dag, "2024-01-05")) == (ms(2024, 1, 5), ms(2024, 1, 6))


@pytest.mark.parametrize("schedule, match", [
    (CronPartitionTimetable("0 0 * * *", timezone="UTC", key_format="%Y-%m"), "one interval per partition"),
    (PartitionedAtRuntime(), "PartitionedAtRuntime"),
])
def test_an_ingest_dag_whose_keys_name_no_interval_fails_to_parse(tmp_path: Path, schedule: Any, match: str) -> None:
    with pytest.raises(InvalidUsageError, match=match):
        ingest_dag(dag_id="bad", shard_url=(tmp_path / "shard").as_uri(), schedule=schedule, start_date=START,
                   source=LandingSource(str(tmp_path / "landing"), time_column="event_time"))



def test_keys_around_clock_changes_name_their_own_tick_or_are_refused() -> None:
    """Santiago skips the midnight of 2024-09-08 (clocks go forward at 00:00): the key of the day
    before still decodes to its own tick; an hour that clocks going back repeat (Berlin,
    2024-10-27T02) names two ticks and is refused rather than half covered."""
    from airflow.timetables.trigger import CronPartitionTimetable

    from shardsink.airflow.partitions import partition_interval

    santiago = CronPartitionTimetable("0 0 * * *", timezone="America/Santiago", key_format="%Y-%m-%d")
    lower, upper = partition_interval(santiago, "2024-09-07")
    assert datetime.fromtimestamp(lower / 1000, UTC) == datetime(2024, 9, 7, 4, tzinfo=UTC)
    assert upper == lower + 24 * 3600 * 1000  # to the next tick: 01:00 local, as 00:00 does not exist
    berlin = CronPartitionTimetable("0 * * * *", timezone="Europe/Berlin", key_format="%Y-%m-%dT%H")
    with pytest.raises(InvalidUsageError, match="more than one cron tick"):
        partition_interval(berlin, "2024-10-27T02")
    lower, upper = partition_interval(berlin, "2024-10-27T04")
    assert upper - lower == 3600 * 1000
