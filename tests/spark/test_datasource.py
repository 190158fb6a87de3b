"""The ``shardsink`` Spark data source and the leased read helpers, on both backends.

Reference results come from :meth:`Shard.snapshot` / :meth:`Shard.changes` (pyarrow).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from shardsink import CorruptionError, InvalidUsageError, ReadFrontierError, Shard
from shardsink.core.plan import ReadPlan
from shardsink.core.state import PartMeta
from shardsink.spark import datasource as ds
from shardsink.spark.read import ShardReads, read_changes, read_snapshot

UTC_MS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int32()), ("x", pa.float64()), ("ts", UTC_MS)])


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 6
    names = [*SCHEMA.names, "_time", "_diff"]
    types = [*SCHEMA.types, pa.int64(), pa.int64()]
    return pa.table({n: pa.array(c, t) for n, c, t in zip(names, cols, types, strict=True)})


def _stage_two_parts(shard: Shard, rows: list[tuple[Any, ...]], lower: int, upper: int, desc: str) -> None:
    """One batch written as two parts (as two Spark tasks would), sharing some (row, time)."""
    half = len(rows) // 2 + 1
    staged = [shard.stage(_table(rows[:half]), lower=lower, upper=upper, desc_id=desc),
              shard.stage(_table(rows[half - 1:]), lower=lower, upper=upper, desc_id=desc)]
    shard.compare_and_append(staged, expected_upper=lower, new_upper=upper, desc_id=desc)


@pytest.fixture
def shard(shard_url: str) -> Shard:
    """Three batches over [0, 30): inserts, multiplicities, nulls, retractions, re-inserts."""
    s = Shard.create(shard_url, SCHEMA)
    b1 = [(f"k{i}", i, i / 2, 1_000 * i, i % 10, 1) for i in range(40)]
    b1 += [("dup", 7, None, None, 3, 2), (None, None, None, None, 5, 1)]
    _stage_two_parts(s, b1, 0, 10, "b1")
    b2 = [(f"k{i}", i, i / 2, 1_000 * i, 10 + i % 10, -1) for i in range(0, 40, 3)]  # retractions
    b2 += [("dup", 7, None, None, 12, -1), ("new", 1, 1.5, 5, 15, 3)]
    s.append(_table(b2), lower=10, upper=20, desc_id="b2")
    b3 = [(f"k{i}", i, i / 2, 1_000 * i, 25, 1) for i in range(0, 9, 3)]  # re-inserts
    s.append(_table(b3), lower=20, upper=30, desc_id="b3")
    return s


def _canon(t: pa.Table, keys: list[str]) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples; timestamps compared as UTC microseconds."""
    cols = []
    for name in keys:
        c = t.column(name)
        if pa.types.is_timestamp(c.type):
            c = c.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        cols.append(c.to_pylist())
    return sorted(zip(*cols, strict=True), key=repr)


def _spark_table(df: Any) -> pa.Table:
    return df.toArrow()


@pytest.mark.parametrize("as_of", [4, 12, 29])
def test_snapshot_matches_shard(spark: Any, shard: Shard, as_of: int) -> None:
    expected = shard.snapshot(as_of)
    with read_snapshot(spark, shard.url, as_of) as df:
        got = _spark_table(df)
    keys = [*SCHEMA.names, "_count"]
    assert got.column_names == keys
    assert _canon(got, keys) == _canon(expected, keys)
    assert shard.leases() == []  # released at the end of the block


def test_changes_match_shard(spark: Any, shard: Shard) -> None:
    keys = [*SCHEMA.names, "_time", "_diff"]
    for lo, hi in [(0, 30), (5, 21)]:
        with read_changes(spark, shard.url, lo, hi) as df:
            got = _spark_table(df)
        assert _canon(got, keys) == _canon(shard.changes(lo, hi), keys)


def test_changes_from_since_read_earlier_times_as_since_like_the_shard(spark: Any, shard: Shard) -> None:
    """After since advances, a change feed from since starts with the history before it
    collapsed at since, whether a batch was compacted (times stored advanced) or not."""
    from shardsink.maintenance import advance_since, compact_batches

    advance_since(shard, target=15)
    compact_batches(shard, shard.batches()[:1], since=15)  # b1 alone: its times are now stored as 15
    keys = [*SCHEMA.names, "_time", "_diff"]
    for lo, hi in [(15, 30), (15, 16), (16, 30)]:
        with read_changes(spark, shard.url, lo, hi) as df:
            got = _spark_table(df)
        assert _canon(got, keys) == _canon(shard.changes(lo, hi), keys), (lo, hi)


def test_format_snapshot_default_as_of_and_repeat(spark: Any, shard: Shard) -> None:
    ds.register(spark)
    raw = spark.read.format("shardsink").load(shard.url)  # as_of = upper - 1 = 29
    assert raw.columns == [*SCHEMA.names, "_diff"]
    summed = raw.groupBy("k", "n").sum("_diff").filter("`sum(_diff)` != 0").toArrow()
    want = shard.snapshot(29)
    assert dict(zip(zip(summed["k"].to_pylist(), summed["n"].to_pylist(), strict=True),
                    summed["sum(_diff)"].to_pylist(), strict=True)) == {
        (k, n): c for k, n, c in zip(want["k"].to_pylist(), want["n"].to_pylist(), want["_count"].to_pylist(),
                                     strict=True)}
    with read_snapshot(spark, shard.url, repeat=True) as df:
        assert df.columns == SCHEMA.names
        assert df.count() == sum(want["_count"].to_pylist())


def test_one_partition_per_part_or_group(spark: Any, shard: Shard) -> None:
    ds.register(spark)
    parts = [p for b in shard.batches() for p in b.parts]
    assert len(parts) == 4
    one_each = spark.read.format("shardsink").option("partitionBytes", "1").load(shard.url)
    assert one_each.rdd.getNumPartitions() == 4
    grouped = spark.read.format("shardsink").load(shard.url)
    assert grouped.rdd.getNumPartitions() == 1


def test_group_parts_packs_by_size() -> None:
    parts = tuple(PartMeta(f"p{i}", 1, size, 0, 0) for i, size in enumerate([50, 30, 30, 200, 10]))
    groups = ds.group_parts(parts, 100)
    assert [[p.key for p in g] for g in groups] == [["p0", "p1"], ["p2"], ["p3"], ["p4"]]
    assert ds.group_parts((), 100) == []


def test_as_of_outside_frontiers_fails_on_driver(spark: Any, shard: Shard) -> None:
    for bad in (30, -1):
        with pytest.raises(ReadFrontierError, match=rf"as_of {bad} is not readable"), \
                read_snapshot(spark, shard.url, bad):
            pass
    with pytest.raises(ReadFrontierError, match="beyond upper 30"), read_changes(spark, shard.url, 0, 31):
        pass
    assert shard.leases() == []
    ds.register(spark)
    with pytest.raises(Exception, match="ReadFrontierError: as_of 30 is not readable"):
        spark.read.format("shardsink").option("as_of", "30").load(shard.url)  # load() runs no job


def test_lease_held_during_the_job_and_released(spark: Any, shard: Shard) -> None:
    with ShardReads(spark, holder="test-job") as reads:
        df = reads.snapshot(shard.url, 12)
        live = shard.leases()
        assert [(x.as_of, x.holder) for x in live] == [(12, "test-job")]
        assert shard.min_leased_as_of() == 12
        df.count()
        changes = reads.changes(shard.url, 10, 20)
        assert sorted(x.as_of for x in shard.leases()) == [10, 12]
        changes.count()
    assert shard.leases() == []


def test_negative_multiplicity_is_corruption(spark: Any, tmp_path: Any) -> None:
    s = Shard.create(f"file://{tmp_path}/neg", SCHEMA)
    s.append(_table([("a", 1, 0.0, 0, 1, 1), ("gone", 2, 0.0, 0, 2, -1)]), lower=0, upper=10)
    with pytest.raises(CorruptionError, match=r"negative multiplicity -1 for row .*gone"), \
            read_snapshot(spark, s.url) as df:
        df.collect()
    assert s.leases() == []


def test_missing_part_is_corruption(spark: Any, tmp_path: Any) -> None:
    s = Shard.create(f"file://{tmp_path}/miss", SCHEMA)
    s.append(_table([("a", 1, 0.0, 0, 1, 1)]), lower=0, upper=10)
    s._machine.blob.delete(s.batches()[0].parts[0].key)
    with pytest.raises(CorruptionError, match="is missing"), read_snapshot(spark, s.url) as df:
        df.collect()


def test_empty_shard_reads_empty(spark: Any, tmp_path: Any) -> None:
    s = Shard.create(f"file://{tmp_path}/empty", SCHEMA, upper=5)
    with read_snapshot(spark, s.url) as df:
        assert df.count() == 0
        assert df.columns == [*SCHEMA.names, "_count"]


def _source_updates(url: str, **options: str) -> tuple[ReadPlan, pa.Table]:
    """What the data source's tasks yield for ``options`` (planned and read in this process, no JVM)."""
    plan = ds.plan_read({"path": url, **options})
    reader = ds.ShardReader(plan, ds.TaskSizes.of(options))
    wire = ds.sty.arrow_wire_schema(ds.spark_schema(plan))
    return plan, pa.Table.from_batches([b for g in reader.partitions() for b in reader.read(g)], schema=wire)


def test_the_source_projects_every_part_by_field_id_like_the_shard(shard_url: str) -> None:
    """Issue 19: parts written under six schema ids (add, rename, drop, widen, a dropped name
    added again) read as the reader's schema, equal to Shard.snapshot / Shard.changes."""
    from support.evolved_shard import CHANGES, SNAPSHOTS, evolved_shard, rows

    s = evolved_shard(shard_url)
    for as_of, choice in SNAPSHOTS:
        want = s.snapshot(as_of, schema=choice)  # type: ignore[arg-type]
        plan, got = _source_updates(s.url, as_of=str(as_of), schema=choice)
        assert got.schema.names == [*want.schema.names[:-1], "_diff"], (as_of, choice)
        assert any(r.schema_id != plan.target.id for r in plan.parts), "some parts were written under another id"
        summed = got.group_by(got.schema.names[:-1]).aggregate([("_diff", "sum")])
        summed = summed.filter(pa.compute.not_equal(summed["_diff_sum"], 0))
        assert rows(summed) == rows(want), (as_of, choice)
    for (lo, hi), choice in CHANGES:
        want = s.changes(lo, hi, schema=choice)  # type: ignore[arg-type]
        _, got = _source_updates(s.url, mode="changes", **{"from": str(lo), "to": str(hi)}, schema=choice)
        summed = got.group_by(got.schema.names[:-1]).aggregate([("_diff", "sum")])
        summed = summed.filter(pa.compute.not_equal(summed["_diff_sum"], 0))
        assert got.schema.names == want.schema.names and rows(summed) == rows(want), (lo, hi, choice)
    assert _source_updates(s.url, as_of="25", schema="2")[1].schema.names == ["k", "n", "f", "new", "x", "_diff"]
    with pytest.raises(InvalidUsageError, match=r"option schema='later' is invalid"):
        ds.plan_read({"path": s.url, "schema": "later"})
    with pytest.raises(InvalidUsageError, match=r"schema id 9 is unknown"):
        ds.plan_read({"path": s.url, "schema": "9"})
