"""Exact ``_diff`` sums in every Spark path (issue 19): an overflow on the way that ends inside
int64 reads exactly, a sum outside int64 is CorruptionError naming the row (as the pyarrow
reads), and Spark staging refuses an append whose equal rows sum outside int64, writing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import CorruptionError, InvalidUsageError, Shard, StagedBatch
from shardsink.core.state import PartMeta
from shardsink.outcome import record_of
from shardsink.spark import diff_sums as sums
from shardsink.spark.correction import correction_frame
from shardsink.spark.read import ShardReads
from shardsink.spark.stage import stage_dataframe

SCHEMA = pa.schema([("k", pa.string())])
B = 5 * 10**18  # two of them leave int64 (max ~9.22e18)
PATHS = ("never", "always")  # the Python data source (exact always) and native reads (bounded by footers)


def _updates(k: str, t: int, d: int) -> pa.Table:
    return pa.table({"k": [k], "_time": [t], "_diff": [d]})


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.fixture
def across_times(tmp_path: Path) -> Shard:
    """Row "a" gets +B at 1, +B at 2, -B at 3 (each append in range on its own): as of 2 it sums
    to 2B (outside int64), as of 3 to B (passing 2B on the way)."""
    s = Shard.create((tmp_path / "times").as_uri(), SCHEMA)
    for t, d in [(1, B), (2, B), (3, -B)]:
        s.append(pa.concat_tables([_updates("a", t, d), _updates("z", t, 1)]), lower=0 if t == 1 else t, upper=t + 1,
                 desc_id=f"d{t}")
    return s


@pytest.fixture
def within_a_time(tmp_path: Path) -> Shard:
    """One batch of three parts, each holding ("a", 5) alone: +B, +B, -B (as three Spark tasks
    may stage them); a second batch of two parts +B, +B at time 15."""
    s = Shard.create((tmp_path / "parts").as_uri(), SCHEMA)
    for lo, hi, t, diffs in [(0, 10, 5, [B, B, -B]), (10, 20, 15, [B, B])]:
        staged = [s.stage(_updates("a", t, d), lower=lo, upper=hi, desc_id=f"b{lo}") for d in diffs]
        s.compare_and_append(staged, expected_upper=lo, new_upper=hi, desc_id=f"b{lo}")
    return s


@pytest.mark.parametrize("native", PATHS)
def test_a_snapshot_passing_int64_on_the_way_reads_exactly_and_one_outside_is_corruption(
        spark: Any, across_times: Shard, native: str) -> None:
    url = across_times.url
    with ShardReads(spark, native=native) as reads:  # type: ignore[arg-type]
        assert _rows(reads.snapshot(url, 3)) == [("a", B), ("z", 3)] == _rows_of(across_times.snapshot(3))
        assert _rows(reads.changes(url, 1, 4)) == [("a", 1, B), ("a", 2, B), ("a", 3, -B), ("z", 1, 1),
                                                   ("z", 2, 1), ("z", 3, 1)]
    named = rf"shard {url} as of 2 has a row whose _count sum overflows int64: {2 * B} for row .*\"a\""
    with pytest.raises(CorruptionError, match=named), ShardReads(spark, native=native) as reads:  # type: ignore[arg-type]
        reads.snapshot(url, 2).collect()
    with pytest.raises(CorruptionError, match="overflows int64"):
        across_times.snapshot(2)  # the pyarrow read agrees


@pytest.mark.parametrize("native", PATHS)
def test_changes_consolidating_parts_past_int64_read_exactly_and_a_sum_outside_is_corruption(
        spark: Any, within_a_time: Shard, native: str) -> None:
    url = within_a_time.url
    with ShardReads(spark, native=native) as reads:  # type: ignore[arg-type]
        assert _rows(reads.changes(url, 0, 10)) == [("a", 5, B)] == _rows_of(within_a_time.changes(0, 10))
    named = rf"shard {url} changes \[0, 20\) has a row whose _diff sum overflows int64: {2 * B} for row"
    with pytest.raises(CorruptionError, match=named), ShardReads(spark, native=native) as reads:  # type: ignore[arg-type]
        reads.changes(url, 0, 20).collect()


def test_corrections_sum_persisted_and_desired_exactly(spark: Any, across_times: Shard) -> None:
    desired = spark.createDataFrame([("a",), ("z",)], "k string")
    with ShardReads(spark) as reads:
        persisted = reads.updates(across_times.url, 3)  # a: B (via 2B), z: 3
        got = correction_frame(desired, persisted, schema=SCHEMA, upper=10, where=across_times.url)
        assert _rows(got) == [("a", 9, 1 - B), ("z", 9, -2)]
        counted = spark.createDataFrame([("a", B), ("a", B), ("a", -B), ("z", 3)], "k string, _count bigint")
        assert _rows(correction_frame(counted, persisted, schema=SCHEMA, upper=10, where="out")) == []
    over = r"output shard .* has a row whose _diff sum overflows int64"
    with pytest.raises(CorruptionError, match=over), ShardReads(spark) as reads:
        persisted = reads.updates(across_times.url, 2)
        correction_frame(desired, persisted, schema=SCHEMA, upper=10, where=across_times.url).collect()
    twice = spark.createDataFrame([("a", B), ("a", B)], "k string, _count bigint")
    over = rf"desired rows of out has a row whose _count sum overflows int64: {2 * B}"
    with pytest.raises(InvalidUsageError, match=over), ShardReads(spark):
        correction_frame(twice, None, schema=SCHEMA, upper=10, where="out").collect()


def _two_partitions(spark: Any, rows: list[tuple[str, int, int]]) -> Any:
    """``rows`` one per Spark partition: no task sees two."""
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), "k string, _time bigint, _diff bigint")
    assert df.rdd.glom().map(len).collect() == [1] * len(rows)
    return df


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "parts").rglob("*") if p.is_file()) if (root / "parts").exists() else []


WRITERS = [("sorted", "python"), ("unordered", "spark"), ("unordered", "python")]


@pytest.mark.parametrize(("order", "writer"), WRITERS)
def test_spark_staging_refuses_equal_rows_summing_outside_int64_and_leaves_nothing(
        spark: Any, tmp_path: Path, order: str, writer: str) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    for df in (_two_partitions(spark, [("a", 1, B), ("a", 1, B), ("b", 1, 1)]),  # across tasks: the driver's check
               spark.createDataFrame([("a", 1, B), ("a", 1, B)], "k string, _time bigint, _diff bigint").coalesce(1)):
        with pytest.raises(Exception) as e:
            stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order=order,  # type: ignore[arg-type]
                            writer=writer)  # type: ignore[arg-type]
        rec = record_of(e.value)
        assert rec.error_class == "InvalidUsageError" and "_diff sum overflows int64" in rec.message, rec
        assert _files(tmp_path / "s") == [], "nothing of a refused append stays"
    assert s.batches() == ()


@pytest.mark.parametrize(("order", "writer"), WRITERS)
def test_spark_staging_accepts_equal_rows_passing_int64_on_the_way_and_reads_them_exactly(
        spark: Any, tmp_path: Path, order: str, writer: str) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    df = _two_partitions(spark, [("a", 1, B), ("a", 1, B), ("a", 1, -B), ("b", 2, 1)])
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order=order,  # type: ignore[arg-type]
                            writer=writer)  # type: ignore[arg-type]
    s.compare_and_append([StagedBatch("d", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="d")
    assert _rows_of(s.snapshot(9)) == [("a", B), ("b", 1)]
    with ShardReads(spark, native="always") as reads:
        assert _rows(reads.snapshot(s.url, 9)) == [("a", B), ("b", 1)]


def test_the_cheap_sum_only_where_part_statistics_bound_every_sum(tmp_path: Path) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    s.append(pa.table({"k": ["a", "b"], "_time": [0, 0], "_diff": [3, -7]}), lower=0, upper=1, desc_id="d0")
    parts = [p for b in s.batches() for p in b.parts]
    root = f"file://{tmp_path / 's'}"
    assert not sums.parts_may_overflow(root, parts)
    assert sums.parts_may_overflow("s3a://bucket/x", parts), "no footer reads on a remote store: exact"
    big = [PartMeta(parts[0].key, 2**62, 1, 0, 0)]  # 7 x 2**62 rows could leave int64
    assert sums.parts_may_overflow(root, big)
    assert sums.parts_may_overflow(root, [PartMeta("parts/gone.parquet", 2, 1, 0, 0)]), "unread footer: exact"
    assert not sums.may_overflow(None, 1) and sums.may_overflow(None, 2)
    assert not sums.may_overflow(2**62, 1) and sums.may_overflow(2**62, 2) and not sums.may_overflow(2**61, 2)


def _rows_of(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def test_a_refused_append_leaves_no_part_on_either_backend(spark: Any, shard_url: str) -> None:
    """The executors' pyarrow path uploads before the driver sees the sums: it deletes them (S3 too)."""
    s = Shard.create(shard_url, SCHEMA)
    df = _two_partitions(spark, [("a", 1, -B), ("a", 1, -B), ("b", 2, 1)])
    with pytest.raises(InvalidUsageError, match=rf"has rows whose _diff sum overflows int64, e.g. {-2 * B} for row"):
        stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", writer="python")
    assert [o.key for o in s._machine.blob.list("parts/")] == []


def test_repeating_a_row_more_often_than_one_spark_array_holds_is_refused_naming_it(spark: Any,
                                                                                   tmp_path: Path) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    s.append(_updates("many", 0, 2**31), lower=0, upper=1, desc_id="d0")
    named = r"cannot repeat a row 2147483648 times \(repeat=True\) for row .*many"
    with pytest.raises(InvalidUsageError, match=named), ShardReads(spark) as reads:
        reads.snapshot(s.url, 0, repeat=True).collect()
