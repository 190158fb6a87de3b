"""Compaction across schema ids (issue 19 §1): batches written under different schemas merge
into one batch of the newest schema; every read is the same before and after, and the merged
parts hold the newest schema's columns (a dropped column's data is gone)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.maintenance.compact import CompactOptions, compact_batches
from shardsink.maintenance.merge import MergeOptions


def _t(cols: dict[str, list[object]], t: int, diff: int = 1) -> pa.Table:
    n = len(next(iter(cols.values())))
    return pa.table({**cols, "_time": [t] * n, "_diff": [diff] * n})


@pytest.mark.parametrize("small_bytes", [1 << 30, 0], ids=["one-shot", "streamed"])
def test_compaction_merges_batches_of_different_schema_ids_into_the_newest(tmp_path: Path, small_bytes: int) -> None:
    s = Shard.create((tmp_path / "s").as_uri(), pa.schema([("a", pa.int32()), ("b", pa.string()), ("c", pa.int32())]))
    # Sorted by (a, b, c) but not by (a, c): dropping b must re-sort, and rows equal once b is gone sum.
    s.append(_t({"a": pa.array([1, 1, 2], pa.int32()), "b": ["x", "y", "z"], "c": pa.array([2, 1, 5], pa.int32())},
                0), lower=0, upper=1)
    s.evolve(SchemaChange(kind="widen", name="c", type="int64"))
    s.append(_t({"a": pa.array([1], pa.int32()), "b": ["q"], "c": [2]}, 1), lower=1, upper=2)
    s.evolve(SchemaChange(kind="drop", name="b"))
    s.evolve(SchemaChange(kind="rename", name="a", new_name="id"))
    s.evolve(SchemaChange(kind="add", name="n", type="string"))
    retract = {"id": pa.array([2], pa.int32()), "c": [5], "n": pa.array([None], pa.string())}
    s.append(_t(retract, 2, diff=-1), lower=2, upper=3)
    s.append(_t({"id": pa.array([3], pa.int32()), "c": [0], "n": ["z"]}, 3), lower=3, upper=4)
    assert [b.schema_id for b in s.batches()] == [0, 1, 4, 4]
    reads = {t: s.snapshot(t).sort_by([("id", "ascending"), ("c", "ascending")]) for t in range(4)}
    feed = s.changes(0, 4).sort_by([("_time", "ascending"), ("id", "ascending"), ("c", "ascending")])
    opts = CompactOptions(merge=MergeOptions(small_bytes=small_bytes))
    merge = compact_batches(s, s.batches(), since=0, options=opts)
    assert merge.status == "applied"
    (batch,) = s.batches()
    assert batch.schema_id == 4
    for t, want in reads.items():
        assert s.snapshot(t).sort_by([("id", "ascending"), ("c", "ascending")]).equals(want), t
    assert s.changes(0, 4).sort_by([("_time", "ascending"), ("id", "ascending"), ("c", "ascending")]).equals(feed)
    assert reads[0].to_pylist() == [{"id": 1, "c": 1, "n": None, "_count": 1},
                                    {"id": 1, "c": 2, "n": None, "_count": 1},
                                    {"id": 2, "c": 5, "n": None, "_count": 1}]
    assert reads[1].to_pylist()[1] == {"id": 1, "c": 2, "n": None, "_count": 2}
    for p in batch.parts:
        stored = pq.read_schema(tmp_path / "s" / p.key)
        assert stored.names == ["id", "c", "n", "_time", "_diff"] and stored.field("c").type == pa.int64()
