"""Parts whose diffs are implicit ones (PartMeta.diffs "ones", core/part_file.py): Spark's fast
ingest path writes no ``_diff`` column, and every reader reads those parts as diff 1, alone
and mixed with parts that store their diffs, before and after compaction."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardsink.read as sread
from shardsink import CorruptionError, Shard, StagedBatch
from shardsink.core.part_io import open_part
from shardsink.maintenance import CompactOptions, ScheduleOptions, compact
from shardsink.spark.read import ShardReads
from shardsink.spark.stage import stage_dataframe
from shardsink.storage.local import LocalBlob

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])
# Duplicates of (row, time) across and within partitions: the ones must add up.
ROWS = [("a", 1, 1), ("a", 1, 1), ("b", 2, 2), ("c", None, 3), ("a", 1, 4), (None, 5, 5), ("b", 2, 2)] * 3


def _ingest(spark: Any, tmp_path: Path) -> Shard:
    """Batch 1 staged by Spark without _diff (ones); batch 2 appended with explicit diffs, retracting some."""
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    df = spark.createDataFrame(ROWS, "k string, n long, _time long").repartition(3)
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d1", order="unordered",
                            writer="spark")
    s.compare_and_append([StagedBatch("d1", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="d1")
    s.append(pa.table({"k": ["a", "b", "z"], "n": [1, 2, 9], "_time": [12, 13, 14], "_diff": [-2, -6, 4]}),
             lower=10, upper=20, desc_id="d2")
    return s


def _model(as_of: int) -> Counter[tuple[Any, ...]]:
    c: Counter[tuple[Any, ...]] = Counter()
    for k, n, t in ROWS:
        if t <= as_of:
            c[(k, n)] += 1
    for k, n, t, d in [("a", 1, 12, -2), ("b", 2, 13, -6), ("z", 9, 14, 4)]:
        if t <= as_of:
            c[(k, n)] += d
    return +c


def _counted(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter({(r["k"], r["n"]): r["_count"] for r in rows})


def _feed(rows: list[dict[str, Any]] | list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows), key=repr)


def test_spark_ingest_writes_no_diff_column_and_records_its_parts_as_ones(spark: Any, tmp_path: Path) -> None:
    s = _ingest(spark, tmp_path)
    first = s.batches()[0]
    assert first.parts and all(p.diffs == "ones" and p.implicit_diffs for p in first.parts)
    for p in first.parts:
        stored = pq.ParquetFile(tmp_path / "s" / p.key).schema_arrow.names
        assert stored == ["k", "n", "_time"], stored
    assert all(p.diffs == "column" for p in s.batches()[1].parts)
    assert b'"diffs"' not in msgspec.json.encode(s.batches()[1].parts[0]), "column parts encode as before"


def test_every_reader_reads_implicit_ones_as_diff_one(spark: Any, tmp_path: Path) -> None:
    import duckdb

    s = _ingest(spark, tmp_path)
    con = duckdb.connect()
    with ShardReads(spark, native="never") as source, ShardReads(spark, native="always") as native:
        for as_of in (1, 2, 9, 12, 19):
            want = _model(as_of)
            assert _counted(s.snapshot(as_of).to_pylist()) == want, as_of
            for reads in (source, native):
                assert Counter({(r[0], r[1]): r[2] for r in reads.snapshot(s.url, as_of).collect()}) == want, as_of
            with sread.duckdb(con, s.url, as_of) as rel:
                assert _counted(rel.to_arrow_table().to_pylist()) == want, as_of
            with sread.polars(s.url, as_of) as lf:
                assert _counted(lf.collect().to_dicts()) == want, as_of
        for lo, hi in [(0, 20), (0, 10), (2, 3), (10, 20)]:
            want_feed = _feed(s.changes(lo, hi).to_pylist())
            assert sum(r[3] for r in want_feed if r[2] < 10) == sum(1 for r in ROWS if lo <= r[2] < hi)
            for reads in (source, native):
                assert _feed(reads.changes(s.url, lo, hi).collect()) == want_feed, (lo, hi)
            with sread.duckdb(con, s.url, changes=(lo, hi)) as rel:
                assert _feed(rel.to_arrow_table().to_pylist()) == want_feed, (lo, hi)
            with sread.polars(s.url, changes=(lo, hi)) as lf:
                assert _feed(lf.collect().to_dicts()) == want_feed, (lo, hi)


def test_compaction_turns_implicit_ones_into_stored_consolidated_diffs(spark: Any, tmp_path: Path) -> None:
    s = _ingest(spark, tmp_path)
    before = {t: _counted(s.snapshot(t).to_pylist()) for t in (9, 19)}
    compact(s, options=CompactOptions(schedule=ScheduleOptions(min_rows=1)))
    batches = s.batches()
    assert all(p.diffs == "column" and p.is_sorted for b in batches for p in b.parts)
    assert {t: _counted(s.snapshot(t).to_pylist()) for t in (9, 19)} == before == {t: _model(t) for t in (9, 19)}


def _part_bytes(t: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


def test_a_part_contradicting_its_recorded_diffs_is_corruption(spark: Any, tmp_path: Path) -> None:
    s = _ingest(spark, tmp_path)
    p = s.batches()[0].parts[0]
    blob = LocalBlob(str(tmp_path / "s"))
    f = open_part(blob, p)
    assert f.read().column("_diff").to_pylist() == [1] * p.rows
    assert f.read(columns=["_diff", "k"]).column_names == ["_diff", "k"]
    assert [b.column_names for b in f.iter_batches(columns=["_time"])] == [["_time"]]
    with pytest.raises(CorruptionError, match="does not know"):
        open_part(blob, msgspec.structs.replace(p, diffs="twos"))
    stored = s.batches()[1].parts[0]
    with pytest.raises(CorruptionError, match="stores a _diff column"):
        open_part(blob, msgspec.structs.replace(stored, diffs="ones"))
