"""Column names with a dot and a space (``a.b``, ``c d``) are names, never syntax, in every
Spark path: staging (both writers), snapshot/changes reads (data source and native), the
correction and a row-wise view's signed updates round-trip them exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard, StagedBatch
from shardsink.spark.correction import compute_correction
from shardsink.spark.linear import RowWiseView, signed_views
from shardsink.spark.read import ShardReads
from shardsink.spark.stage import stage_dataframe

SCHEMA = pa.schema([("a.b", pa.string()), ("c d", pa.int64())])
DDL = "`a.b` string, `c d` bigint"
ROWS = [("x.y", 1, 1, 1), ("x.y", 1, 1, 2), ("z", 2, 3, 1), (None, 3, 4, 1), ("z", 2, 5, -1), ("w", 4, 6, 3)]


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _table_rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


@pytest.mark.parametrize(("order", "writer"), [("sorted", "python"), ("unordered", "spark"), ("unordered", "python")])
def test_staging_and_reads_round_trip_a_dot_and_a_space_in_column_names(spark: Any, tmp_path: Path, order: str,
                                                                        writer: str) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    df = spark.createDataFrame(ROWS, f"{DDL}, _time bigint, _diff bigint").repartition(2)
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order=order,  # type: ignore[arg-type]
                            writer=writer)  # type: ignore[arg-type]
    s.compare_and_append([StagedBatch("d", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="d")
    want = [("w", 4, 3), ("x.y", 1, 3), (None, 3, 1)]
    assert _table_rows(s.snapshot(9)) == sorted(want, key=repr)
    for native in ("never", "always"):
        with ShardReads(spark, native=native) as reads:  # type: ignore[arg-type]
            snap = reads.snapshot(s.url, 9)
            assert snap.columns == ["a.b", "c d", "_count"]
            assert _rows(snap) == _table_rows(s.snapshot(9)), native
            assert Counter(_rows(reads.snapshot(s.url, 9, repeat=True))) == Counter(
                {(k, n): c for k, n, c in want}), native
            assert _rows(reads.changes(s.url, 0, 10)) == _table_rows(s.changes(0, 10)), native


def test_a_correction_and_signed_views_round_trip_dotted_names(spark: Any, tmp_path: Path) -> None:
    out = Shard.create((tmp_path / "out").as_uri(), SCHEMA)
    out.append(pa.table({"a.b": ["x.y", "gone"], "c d": [1, 9], "_time": [0, 0], "_diff": [1, 2]}),
               lower=0, upper=1, desc_id="d0")
    desired = spark.createDataFrame([("x.y", 1), ("x.y", 1), ("new", 5)], DDL)
    with ShardReads(spark) as reads:
        corr = compute_correction(reads, desired, out.url, lower=1, upper=5)
        assert corr.columns == ["a.b", "c d", "_time", "_diff"]
        assert _rows(corr) == [("gone", 9, 4, -2), ("new", 5, 4, 1), ("x.y", 1, 4, 1)]
        raw = reads.updates(out.url, 0)
        rw = RowWiseView(name="in", url=out.url, fingerprint=None)
        pos, neg = signed_views(rw, raw, run=lambda frames: frames["in"])
        assert _rows(pos) == [("gone", 9), ("gone", 9), ("x.y", 1)] and _rows(neg) == []
