"""Native planning at ten schema ids (issue 19): parts of schema ids whose physical columns
agree share one ``spark.read.parquet`` (:func:`shardsink.spark.native_read.scan_groups`), and
every read equals :meth:`Shard.snapshot` / :meth:`Shard.changes` exactly, with the current
and the as-of schema; an as-of read never fails on a value outside its time that its older,
narrower type cannot hold, and one inside it is CorruptionError naming the column."""

from __future__ import annotations

import io
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.evolved_shard import TEN_CHANGES_READS, TEN_SCAN_GROUPS, TEN_SNAPSHOTS, rows, ten_versions

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError
from shardsink.maintenance.compact import compact_batches
from shardsink.spark import native_read as nr
from shardsink.spark.read import ShardReads


def _spark_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _check_reads(reads: ShardReads, s: Shard, snapshots: list[tuple[int, str]],
                 changes: list[tuple[tuple[int, int], str]]) -> None:
    for as_of, choice in snapshots:
        want = s.snapshot(as_of, schema=choice)  # type: ignore[arg-type]
        df = reads.snapshot(s.url, as_of, schema=choice)  # type: ignore[arg-type]
        assert df.columns == want.schema.names, (as_of, choice)
        assert _spark_rows(df) == rows(want), (as_of, choice)
    for (lo, hi), choice in changes:
        want = s.changes(lo, hi, schema=choice)  # type: ignore[arg-type]
        df = reads.changes(s.url, lo, hi, schema=choice)  # type: ignore[arg-type]
        assert df.columns == want.schema.names, (lo, hi, choice)
        assert _spark_rows(df) == rows(want), (lo, hi, choice)


def test_reads_at_ten_schema_ids_equal_the_shards_on_both_paths(spark: Any, tmp_path: Any) -> None:
    s = ten_versions(f"file://{tmp_path}/ten")
    assert [b.schema_id for b in s.batches()] == list(range(10))
    with ShardReads(spark, native="always") as fast, ShardReads(spark, native="never") as slow:
        for reads in (fast, slow):
            _check_reads(reads, s, TEN_SNAPSHOTS, TEN_CHANGES_READS)


def test_schema_ids_share_a_scan_unless_a_name_means_another_column_or_spark_cannot_promote(tmp_path: Any) -> None:
    """A case-only rename, a name re-used for a new field id and a decimal widening split the
    groups; integer widenings and renames to a fresh name do not. Dropped columns are not read."""
    s = ten_versions(f"file://{tmp_path}/ten")
    h = s.reader().head().header
    plan = s.reader().plan(schema=h.schemas[-1].id)
    assert len(plan.parts) == sum(len(b.parts) for b in s.batches())
    groups = nr.scan_groups(plan, plan.parts)
    assert [g.ids for g in groups] == TEN_SCAN_GROUPS
    assert sorted(groups[0].columns) == ["d", "k", "n", "s", "v", "x"]  # f dropped: not read
    assert groups[0].columns["n"][1].simpleString() == "smallint", "the widest type the group holds"
    older = s.reader().plan(schema=h.schemas[2].id)
    old = nr.scan_groups(older, older.parts)
    assert all("s" not in g.columns or g.columns["s"][0] == h.schemas[2].fields[4].id for g in old)


def test_spark_promotes_every_widening_it_is_asked_to_exactly(spark: Any, tmp_path: Any) -> None:
    """int8 -> int16 -> int32 -> int64 and float32 -> float64 at the types' limits, read in one
    scan as the widest type (nr._PROMOTIONS), and as each older type with schema='as_of'."""
    s = Shard.create(f"file://{tmp_path}/w", pa.schema([("n", pa.int8()), ("f", pa.float32())]))
    values: list[tuple[Any, ...]] = [(-128, 0.1), (127, -3.4028234663852886e38), (None, None)]
    changes = [SchemaChange(kind="widen", name="n", type=t) for t in ("int16", "int32", "int64")]
    changes.append(SchemaChange(kind="widen", name="f", type="float64"))
    limits: list[tuple[Any, ...]] = [(-2**15, 1e-45), (2**31 - 1, 2.5), (2**62, 0.1), (-2**63, 1e300)]
    for i, row in enumerate([values, *[[r] for r in limits]]):
        if i:
            s.evolve(changes[i - 1])
        t = pa.table({"n": pa.array([r[0] for r in row], s.schema.field("n").type),
                      "f": pa.array([r[1] for r in row], s.schema.field("f").type),
                      "_time": [10 * i] * len(row), "_diff": [1] * len(row)})
        s.append(t, lower=10 * i, upper=10 * i + 10, desc_id=f"b{i}")
    plan = s.reader().plan()
    groups = nr.scan_groups(plan, plan.parts)
    assert [g.ids for g in groups] == [[0, 1, 2, 3, 4]]
    key = "spark.sql.parquet.enableVectorizedReader"
    saved = spark.conf.get(key)
    try:
        for vectorized in ("true", "false"):  # Spark's row-based reader too (e.g. over 100 columns)
            spark.conf.set(key, vectorized)
            with ShardReads(spark, native="always") as reads:
                _check_reads(reads, s, [(49, "current"), (9, "as_of"), (19, "as_of"), (29, "as_of"), (39, "as_of")],
                             [((0, 50), "current"), ((0, 40), "as_of")])
    finally:
        spark.conf.set(key, saved)


def _widened(url: str) -> Shard:
    """k int32 at times 0..9, widened to int64 at 10, then ``k = 2**40`` at 10: compacted into
    one part (k int64) that holds 2**40 at a time the old schema never saw."""
    s = Shard.create(url, pa.schema([("k", pa.int32()), ("v", pa.string())]))
    s.append(pa.table({"k": pa.array([1, 2], pa.int32()), "v": ["a", "b"], "_time": [0, 5], "_diff": [1, 1]}),
             lower=0, upper=10)
    s.evolve(SchemaChange(kind="widen", name="k", type="int64"))
    s.append(pa.table({"k": pa.array([2**40, 2], pa.int64()), "v": ["c", "b"], "_time": [10, 12], "_diff": [1, -1]}),
             lower=10, upper=20)
    assert compact_batches(s, s.reader().batches(), since=s.info().since).status == "applied"
    assert len(s.batches()) == 1 and s.batches()[0].schema_id == 1
    return s


def test_an_as_of_read_of_a_compacted_part_never_casts_a_value_outside_its_time(spark: Any, tmp_path: Any) -> None:
    """Including under a predicate on the narrowed column, which Spark may evaluate before the
    read's own time filter (the cast is guarded by the time itself)."""
    s = _widened(f"file://{tmp_path}/c")
    with ShardReads(spark, native="always") as reads:
        _check_reads(reads, s, [(5, "as_of"), (9, "as_of"), (19, "as_of"), (19, "current")],
                     [((0, 10), "as_of"), ((0, 20), "as_of"), ((3, 6), "as_of")])
        assert reads.snapshot(s.url, 5, schema="as_of").schema["k"].dataType.simpleString() == "int"
        assert _spark_rows(reads.changes(s.url, 0, 10, schema="as_of").filter("k > 1")) == [(2, "b", 5, 1)]
        assert _spark_rows(reads.snapshot(s.url, 9, schema="as_of").filter("k + 1 > 0")) == [(1, "a", 1),
                                                                                              (2, "b", 1)]


def test_a_value_inside_the_reads_time_that_its_type_cannot_hold_is_corruption_naming_the_column(
        spark: Any, tmp_path: Any) -> None:
    """The compacted part rewritten by hand so that k = 2**40 at time 0: every as-of read that
    includes time 0 fails as the pyarrow read does, not with Spark's CAST_OVERFLOW."""
    s = _widened(f"file://{tmp_path}/bad")
    key = s.batches()[0].parts[0].key
    got = s._machine.blob.get(key)
    assert got is not None
    t = pq.read_table(io.BytesIO(got.data))
    k = t.column("k").to_pylist()
    k[t.column("_time").to_pylist().index(0)] = 2**40
    buf = io.BytesIO()
    pq.write_table(t.set_column(0, t.schema.field(0), pa.array(k, pa.int64())), buf)
    s._machine.blob.put(key, buf.getvalue())
    shape = (rf"^shard {re.escape(s.url)}: column 'k' \(field id 1, stored as 'k'\) holds a value that is not a "
             r"int32 under the schema at the read's time: ")
    with pytest.raises(CorruptionError, match=shape):
        s.snapshot(5, schema="as_of")
    for read in (lambda r: r.snapshot(s.url, 5, schema="as_of"), lambda r: r.changes(s.url, 0, 10, schema="as_of")):
        with pytest.raises(CorruptionError, match=shape + "1099511627776"), ShardReads(spark, native="always") as r:
            read(r).collect()
    with ShardReads(spark, native="always") as reads:  # times outside it still read
        assert _spark_rows(reads.changes(s.url, 3, 10, schema="as_of")) == [(2, "b", 5, 1)]
        assert _spark_rows(reads.snapshot(s.url, 19)) == sorted([(2**40, "a", 1), (2**40, "c", 1)], key=repr)
