"""Compaction across schema ids (issue 19 §1): batches written under different schemas merge
into one batch of the newest schema; every read is the same before and after, and the merged
parts hold the newest schema's columns (a dropped column's data is gone, once no readable time
shows it: before that, ``as_of`` reads still do, so those batches are kept out)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.maintenance import advance_since, compact
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
    # b was dropped at upper 2: while since < 2, as_of reads still show it and no merge may
    # delete it (see test_a_dropped_column_survives_compaction_while_a_readable_time_shows_it).
    advance_since(s, target=2)
    feed = s.changes(2, 4).sort_by([("_time", "ascending"), ("id", "ascending"), ("c", "ascending")])
    opts = CompactOptions(merge=MergeOptions(small_bytes=small_bytes))
    merge = compact_batches(s, s.batches(), since=2, options=opts)
    assert merge.status == "applied"
    (batch,) = s.batches()
    assert batch.schema_id == 4
    for t in (2, 3):
        assert s.snapshot(t).sort_by([("id", "ascending"), ("c", "ascending")]).equals(reads[t]), t
    assert s.changes(2, 4).sort_by([("_time", "ascending"), ("id", "ascending"), ("c", "ascending")]).equals(feed)
    assert reads[0].to_pylist() == [{"id": 1, "c": 1, "n": None, "_count": 1},
                                    {"id": 1, "c": 2, "n": None, "_count": 1},
                                    {"id": 2, "c": 5, "n": None, "_count": 1}]
    assert reads[1].to_pylist()[1] == {"id": 1, "c": 2, "n": None, "_count": 2}
    for p in batch.parts:
        stored = pq.read_schema(tmp_path / "s" / p.key)
        assert stored.names == ["id", "c", "n", "_time", "_diff"] and stored.field("c").type == pa.int64()


def _reads(s: Shard, since: int, upper: int) -> dict[tuple[int, str], list[dict[str, object]]]:
    """Every snapshot at every readable time, under both schema choices, as sorted rows."""
    out = {}
    for t in range(since, upper):
        for choice in ("current", "as_of"):
            snap = s.snapshot(t, schema=choice)  # type: ignore[arg-type]
            out[(t, choice)] = sorted(snap.to_pylist(), key=repr)
    return out


def _stored_columns(root: Path, s: Shard) -> list[list[str]]:
    return [pq.read_schema(root / p.key).names for b in s.batches() for p in b.parts]


@pytest.mark.parametrize("small_bytes", [1 << 30, 0], ids=["one-shot", "streamed"])
def test_a_dropped_column_survives_compaction_while_a_readable_time_shows_it(tmp_path: Path,
                                                                             small_bytes: int) -> None:
    """Issue 19: ``c`` dropped at upper 20, since 5. A read as of 5..19 shows ``c``; compaction
    used to rewrite every batch into the newest schema (no ``c``) and summed rows that differ
    only in ``c``, so those reads changed. Now batches still showing ``c`` are kept out of
    merges into the newest schema (they merge among themselves, keeping ``c``) until since
    passes 20; then the column's data goes and every readable read is still the same."""
    root = tmp_path / "s"
    s = Shard.create(root.as_uri(), pa.schema([("a", pa.int32()), ("c", pa.string())]))
    i32 = lambda *v: pa.array(v, pa.int32())  # noqa: E731
    s.append(_t({"a": i32(1, 1), "c": ["x", "y"]}, 1), lower=0, upper=10)          # differ only in c
    s.append(_t({"a": i32(1, 2), "c": ["x", "z"]}, 12), lower=10, upper=20)
    s.evolve(SchemaChange(kind="drop", name="c"))                                   # current from upper 20
    s.append(_t({"a": i32(3)}, 25), lower=20, upper=30)
    s.append(_t({"a": i32(1)}, 36, diff=-1), lower=30, upper=40)
    advance_since(s, target=5)
    before = _reads(s, 5, 40)
    assert before[(15, "as_of")] == [{"a": 1, "c": "x", "_count": 2}, {"a": 1, "c": "y", "_count": 1},
                                     {"a": 2, "c": "z", "_count": 1}]
    assert [b.schema_id for b in s.batches()] == [0, 0, 1, 1]
    opts = CompactOptions(merge=MergeOptions(small_bytes=small_bytes))

    # A caller that picks inputs mixing both kinds is refused, nothing written.
    seqno, objects = s.info().seqno, sorted(o.key for o in s.admin().list_objects())
    with pytest.raises(InvalidUsageError, match=r"holds column 'c' \(field id 2\), dropped at upper 20, .*"
                                                r"Compact it once since reaches 20"):
        compact_batches(s, s.batches(), since=5, options=opts)
    assert (s.info().seqno, sorted(o.key for o in s.admin().list_objects())) == (seqno, objects)

    res = compact(s, options=opts)                    # the plan: [b0, b1] keep c, [b2, b3] newest
    assert res.applied == 2 and [m.status for m in res.merges] == ["applied", "applied"]
    assert [b.schema_id for b in s.batches()] == [0, 1]
    assert _stored_columns(root, s) == [["a", "c", "_time", "_diff"], ["a", "_time", "_diff"]]
    assert _reads(s, 5, 40) == before, "compaction changed what a readable time reads"
    assert compact(s, options=opts).merges == ()      # nothing left to merge while since < 20

    advance_since(s, target=20)                       # no readable time shows c any more
    before = _reads(s, 20, 40)
    res = compact(s, options=opts)
    assert res.applied == 1
    (batch,) = s.batches()
    assert batch.schema_id == 1 and _stored_columns(root, s) == [["a", "_time", "_diff"]]   # c's data went
    assert _reads(s, 20, 40) == before
    assert before[(20, "as_of")] == [{"a": 1, "_count": 3}, {"a": 2, "_count": 1}]
    assert before[(39, "as_of")] == [{"a": 1, "_count": 2}, {"a": 2, "_count": 1}, {"a": 3, "_count": 1}]


def test_batches_of_different_schema_ids_showing_a_dropped_column_merge_into_the_newest_that_holds_it(
        tmp_path: Path) -> None:
    """A rename and an add between two batches that still show the later-dropped ``c``: they
    merge into the newer of their schemas (it holds ``c`` under its field id), not the newest."""
    root = tmp_path / "s"
    s = Shard.create(root.as_uri(), pa.schema([("a", pa.int32()), ("c", pa.string())]))
    s.append(_t({"a": pa.array([1, 1], pa.int32()), "c": ["x", "y"]}, 1), lower=0, upper=10)
    s.evolve(SchemaChange(kind="rename", name="a", new_name="id"))
    s.evolve(SchemaChange(kind="add", name="n", type="int64"))
    s.append(_t({"id": pa.array([1], pa.int32()), "c": ["y"], "n": [7]}, 12), lower=10, upper=20)
    s.evolve(SchemaChange(kind="drop", name="c"))
    s.append(_t({"id": pa.array([1], pa.int32()), "n": [7]}, 25), lower=20, upper=30)
    before = _reads(s, 0, 30)
    res = compact(s)
    assert [m.status for m in res.merges] == ["applied"] and len(res.merges[0].inputs) == 2
    assert [b.schema_id for b in s.batches()] == [2, 3]
    assert _stored_columns(root, s)[0] == ["id", "c", "n", "_time", "_diff"]
    assert _reads(s, 0, 30) == before


def test_a_rename_or_a_widening_below_since_needs_no_keeping_out(tmp_path: Path) -> None:
    """The claim the plan relies on: reads map by field id and an as_of read filters by time
    before narrowing, so batches across a rename and a widening at an upper above since merge
    into the newest schema and every readable read (both schema choices) stays the same."""
    root = tmp_path / "s"
    s = Shard.create(root.as_uri(), pa.schema([("k", pa.int32()), ("v", pa.string())]))
    s.append(_t({"k": pa.array([1, 2], pa.int32()), "v": ["a", "b"]}, 3), lower=0, upper=10)
    s.evolve(SchemaChange(kind="rename", name="v", new_name="w"))
    s.append(_t({"k": pa.array([1], pa.int32()), "w": ["a"]}, 12), lower=10, upper=20)
    s.evolve(SchemaChange(kind="widen", name="k", type="int64"))
    s.evolve(SchemaChange(kind="widen", name="w", type="large_string"))
    s.append(_t({"k": [2**40, 2], "w": pa.array(["c", "b"], pa.large_string())}, 25), lower=20, upper=30)
    advance_since(s, target=5)
    before = _reads(s, 5, 30)
    assert before[(15, "as_of")] == [{"k": 1, "w": "a", "_count": 2}, {"k": 2, "w": "b", "_count": 1}]
    res = compact(s)
    assert res.applied == 1
    (batch,) = s.batches()
    assert batch.schema_id == 3
    assert pq.read_schema(root / batch.parts[0].key).field("k").type == pa.int64()
    assert _reads(s, 5, 30) == before
    assert s.snapshot(15, schema="as_of").schema.field("k").type == pa.int32()
