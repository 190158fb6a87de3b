"""Natively planned reads (``spark.read.parquet`` of the pinned parts) give exactly the rows
the Python data source gives, and skip consolidation only where no two parts can share a
``(row, _time)``."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest

from shardsink import CorruptionError, Shard
from shardsink.core.state import PartMeta
from shardsink.spark.datasource import isolated_parts
from shardsink.spark.read import ShardReads, _failed_part

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.float64())])


def test_only_parts_whose_time_ranges_overlap_need_consolidating_together() -> None:
    def part(key: str, lo: int, hi: int) -> PartMeta:
        return PartMeta(key, 1, 1, lo, hi)

    parts = [part("a", 0, 9), part("b", 10, 19), part("c", 15, 15), part("d", 30, 40), part("e", 40, 41),
             part("f", 50, 60)]
    alone, shared = isolated_parts(parts, 0, 100)
    assert [p.key for p in alone] == ["a", "f"]
    assert [p.key for p in shared] == ["b", "c", "d", "e"]
    alone, shared = isolated_parts(parts[:5], 0, 40)  # e's time 40 is outside [0, 40): it cannot collide with d
    assert [p.key for p in alone] == ["a", "d", "e"] and [p.key for p in shared] == ["b", "c"]


def test_an_unordered_part_is_always_consolidated_even_alone_in_its_time_range() -> None:
    """An unordered part may repeat a (row, time) within itself (issue 20's fast ingest path)."""
    parts = [PartMeta("a", 1, 1, 0, 9), PartMeta("u", 2, 1, 10, 19, "unordered"), PartMeta("f", 1, 1, 50, 60)]
    alone, shared = isolated_parts(parts, 0, 100)
    assert [p.key for p in alone] == ["a", "f"] and [p.key for p in shared] == ["u"]


def test_reads_over_unordered_parts_staged_by_spark_equal_the_shard_on_both_read_paths(spark: Any,
                                                                                       tmp_path: Any) -> None:
    from shardsink import StagedBatch
    from shardsink.spark.stage import stage_dataframe

    s = Shard.create(f"file://{tmp_path}/unordered", SCHEMA)
    rows = [("b", 1.0, 3, 1), ("a", 2.0, 1, 1), ("b", 1.0, 3, 2), ("c", None, 2, 1), ("a", 2.0, 1, -1),
            (None, 0.5, 5, 1), ("b", 1.0, 3, -1)]
    df = spark.createDataFrame(rows, "k string, x double, _time long, _diff long").repartition(2)
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="u1", order="unordered")
    assert parts and all(p.order == "unordered" for p in parts)
    assert sum(p.rows for p in parts) == len(rows), "unordered staging neither sorts nor consolidates"
    s.compare_and_append([StagedBatch("u1", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="u1")
    s.append(pa.table({"k": ["b"], "x": [1.0], "_time": [12], "_diff": [-1]}), lower=10, upper=20, desc_id="s2")
    assert [b.order for b in s.batches()] == ["unordered", "sorted"]
    with ShardReads(spark, native="never") as slow, ShardReads(spark, native="always") as fast:
        for lo, hi in [(0, 20), (0, 10), (3, 4), (1, 2)]:
            want = sorted((tuple(r.values()) for r in s.changes(lo, hi).to_pylist()), key=repr)
            assert _rows(fast.changes(s.url, lo, hi)) == _rows(slow.changes(s.url, lo, hi)) == want, (lo, hi)
        for as_of in (0, 1, 3, 9, 19):
            want = sorted((tuple(r.values()) for r in s.snapshot(as_of).to_pylist()), key=repr)
            assert _rows(fast.snapshot(s.url, as_of)) == _rows(slow.snapshot(s.url, as_of)) == want, as_of


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_native_and_data_source_reads_give_the_same_rows(spark: Any, tmp_path: Any) -> None:
    s = Shard.create(f"file://{tmp_path}/native", SCHEMA)
    t = pa.table({"k": ["a", "b", None, "a"], "x": [1.0, None, 2.0, 1.0], "_time": [1, 2, 3, 4],
                  "_diff": [1, 2, 1, -1]})
    # two parts of one batch sharing (row, time) ("a", 1.0, 1), as two Spark tasks may write
    staged = [s.stage(t.slice(0, 2), lower=0, upper=10, desc_id="b1"),
              s.stage(t.slice(0, 1), lower=0, upper=10, desc_id="b1")]
    s.compare_and_append(staged, expected_upper=0, new_upper=10, desc_id="b1")
    s.append(t.slice(2).set_column(2, "_time", pa.array([13, 14])), lower=10, upper=20, desc_id="b2")
    with ShardReads(spark, native="never") as slow, ShardReads(spark, native="always") as fast:
        for lo, hi in [(0, 20), (0, 10), (1, 2)]:
            assert _rows(fast.changes(s.url, lo, hi)) == _rows(slow.changes(s.url, lo, hi))
        for as_of in (0, 1, 9, 19):
            assert _rows(fast.snapshot(s.url, as_of)) == _rows(slow.snapshot(s.url, as_of))


def test_spark_reads_use_the_one_float_equality(spark: Any, tmp_path: Any) -> None:
    """-0.0 retracting 0.0 and one NaN payload retracting another cancel in Spark's reads too,
    natively planned and through the data source, including in a part written before floats
    were canonical (issue 17 item 2; shardsink.core.floats)."""
    import struct

    from shardsink import StagedBatch
    from shardsink.core.part_io import write_parts

    def nan(bits: int) -> float:
        return float(struct.unpack("<d", struct.pack("<Q", bits))[0])

    s = Shard.create(f"file://{tmp_path}/floats", SCHEMA)
    old = pa.table({"k": ["z", "n", "keep"], "x": [-0.0, nan(0x7FF8000000000042), -0.0], "_time": [1, 1, 1],
                    "_diff": [1, 1, 1]})
    parts = write_parts(s._machine.blob, old, prefix="parts/old")  # as an older writer left it: raw -0.0 and a payload
    s.compare_and_append([StagedBatch("old", 0, 10, parts)], expected_upper=0, new_upper=10, desc_id="old")
    s.append(pa.table({"k": ["z", "n"], "x": [0.0, nan(0xFFF8000000000000)], "_time": [11, 11], "_diff": [-1, -1]}),
             lower=10, upper=20, desc_id="retract")
    with ShardReads(spark, native="never") as slow, ShardReads(spark, native="always") as fast:
        for reads in (slow, fast):
            assert _rows(reads.snapshot(s.url, 19)) == [("keep", 0.0, 1)]
            assert len(_rows(reads.snapshot(s.url, 5))) == 3
            feed = _rows(reads.changes(s.url, 0, 20))
            assert len(feed) == 5 and {r[0] for r in feed} == {"z", "n", "keep"}


def _one_part_shard(tmp_path: Any, name: str) -> tuple[Shard, str]:
    s = Shard.create(f"file://{tmp_path}/{name}", SCHEMA)
    s.append(pa.table({"k": ["a"], "x": [1.0], "_time": [1], "_diff": [1]}), lower=0, upper=10)
    return s, s.batches()[0].parts[0].key


def test_a_part_vanishing_or_undecodable_in_a_native_job_is_corruption_naming_it(spark: Any, tmp_path: Any) -> None:
    """Classified by Spark's error condition (FAILED_READ_FILE.*) and its path parameter."""
    for name, damage in [("gone", "delete"), ("garbage", "overwrite")]:
        s, key = _one_part_shard(tmp_path, name)
        named = rf"part {re.escape(s.url)}/{re.escape(key)} is missing or unreadable"
        with pytest.raises(CorruptionError, match=named), ShardReads(spark, native="always") as reads:
            df = reads.changes(s.url, 0, 10, consolidate=False)  # planned: the part exists
            if damage == "delete":
                s._machine.blob.delete(key)
            else:
                s._machine.blob.put(key, b"not parquet at all, not even close")
            df.collect()


def test_a_failure_merely_mentioning_a_part_is_not_corruption(spark: Any, tmp_path: Any) -> None:
    """Text is not the classifier: a failure with another error condition passes through unchanged."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    s, key = _one_part_shard(tmp_path, "text")
    text = f"java.io.FileNotFoundException FAILED_READ_FILE {s.url}/{key}"
    with pytest.raises(PySparkException) as got, ShardReads(spark, native="always") as reads:
        reads.changes(s.url, 0, 10, consolidate=False).select(F.raise_error(F.lit(text))).collect()
    assert not isinstance(got.value, CorruptionError)


def test_only_a_failure_without_any_error_condition_is_read_as_text() -> None:
    """Spark's bare java.io.FileNotFoundException (no condition anywhere) is the one text fallback."""
    bare = RuntimeError("java.io.FileNotFoundException: File file:/data/s/parts/d1/u.parquet does not exist")
    assert _failed_part(bare, ["file:///data/s"]) == "file:///data/s/parts/d1/u.parquet"
    assert _failed_part(bare, ["file:///data/other"]) is None
    assert _failed_part(RuntimeError("FAILED_READ_FILE file:/data/s/parts/d1/u.parquet"), ["file:///data/s"]) is None
