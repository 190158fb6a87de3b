"""The compaction plan (pure): size-tiered runs, corrections kept apart, and batches still
showing a dropped column kept out of merges into the newest schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.core.state import BatchMeta, Header, PartMeta
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.maintenance.schedule import ScheduleOptions, merge_target, schedule_merges, visible_drops


def _batch(i: int, *, correction: bool = False, legacy: bool = False, schema_id: int = 0) -> BatchMeta:
    """Batch ``d<i>``; ``correction``: its part records ``corrects`` (``legacy``: only its key's
    ``corrects-`` folder says so, as parts recorded before the field existed)."""
    key = f"parts/d{i}/corrects-0_10/p.parquet" if legacy else f"parts/d{i}/p.parquet"
    part = PartMeta(key, 1, 100, 10 * i, 10 * i, corrects=(0, 10) if correction else None)
    return BatchMeta(f"d{i}", 10 * i, 10 * (i + 1), i + 1, (part,), schema_id=schema_id)


def test_small_batches_merge_into_one_run() -> None:
    batches = [_batch(i) for i in range(6)]
    assert schedule_merges(batches, ScheduleOptions(min_rows=8)) == [tuple(batches)]


@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "recorded-before-the-field"])
def test_batches_holding_corrections_are_never_merged_nor_merged_across(legacy: bool) -> None:
    """Re-processing finds earlier corrections by their parts' records (``corrects``, or the key
    folder of parts recorded before it): a merged part records none, and a re-run of the range
    would apply the same correction twice."""
    batches = [_batch(0), _batch(1), _batch(2, correction=not legacy, legacy=legacy), _batch(3), _batch(4),
               _batch(5)]
    runs = schedule_merges(batches, ScheduleOptions(min_rows=8))
    assert runs == [tuple(batches[:2]), tuple(batches[3:])]
    assert batches[2].parts[0].corrected_range() == (0, 10)
    assert all(p.corrected_range() is None for run in runs for b in run for p in b.parts)


def _seal(s: Shard, lower: int, upper: int) -> None:
    """An empty append: the shard's upper moves from ``lower`` to ``upper``."""
    schema = s.admin().head().header.schema
    empty = pa.table({**{f.name: pa.array([], f.type) for f in schema}, "_time": pa.array([], pa.int64()),
                      "_diff": pa.array([], pa.int64())})
    s.append(empty, lower=lower, upper=upper)


@pytest.fixture
def dropped(tmp_path: Path) -> Header:
    """Schema ids 0 (a, c), 1 (a, c renamed cc) current from upper 20, 2 (a) from 40: c dropped at 40."""
    s = Shard.create((tmp_path / "s").as_uri(), pa.schema([("a", pa.int32()), ("c", pa.string())]), upper=20)
    s.evolve(SchemaChange(kind="rename", name="c", new_name="cc"))
    _seal(s, 20, 40)
    s.evolve(SchemaChange(kind="drop", name="cc"))
    return s.admin().head().header


def test_batches_still_showing_a_dropped_column_are_kept_out_until_since_passes_the_drop(dropped: Header) -> None:
    """Batches of schema ids 0 and 1 hold c (dropped at 40): while since < 40 an as_of read
    shows it, so they never merge with newest-schema batches (a barrier, order kept), only
    among themselves (same dropped fields; the target is the newer of their schemas, which
    holds c). A batch of an old schema starting at or after 40 shows nothing dropped."""
    bs = [_batch(0), _batch(1), _batch(2, schema_id=1), _batch(3, schema_id=2), _batch(4, schema_id=2),
          _batch(5, schema_id=1), _batch(6, schema_id=2)]
    assert [f.name for f in visible_drops(dropped, bs[0], 0)] == ["c"]
    assert visible_drops(dropped, bs[4], 0) == () == visible_drops(dropped, bs[5], 0)  # b5: lower 50 >= 40
    assert schedule_merges(bs, ScheduleOptions(min_rows=8), header=dropped) == [tuple(bs[:3]), tuple(bs[3:])]
    assert merge_target(dropped, bs[:3], 0).id == 1 and merge_target(dropped, bs[3:], 0).id == 2
    with pytest.raises(InvalidUsageError, match=r"batch d2 holds column 'cc' \(field id 2\), dropped at upper 40"):
        merge_target(dropped, bs[2:4], 0)
    # since 39: time 39 still reads c. since 40: nothing readable shows it, one run into the newest.
    assert schedule_merges(bs, ScheduleOptions(min_rows=8), header=dropped, since=39) == [tuple(bs[:3]), tuple(bs[3:])]
    assert schedule_merges(bs, ScheduleOptions(min_rows=8), header=dropped, since=40) == [tuple(bs)]
    assert merge_target(dropped, bs, 40).id == 2
    # Without the header the plan cannot know: the HAZARD its docstring names.
    assert schedule_merges(bs, ScheduleOptions(min_rows=8)) == [tuple(bs)]


def test_a_kept_out_run_between_others_is_a_barrier_and_corrections_still_are(tmp_path: Path) -> None:
    """c added at 20 and dropped at 40: batches of [20, 40) show it, those before and after do
    not. Runs never span the kept-out ones (order is kept), nor a correction batch."""
    s = Shard.create((tmp_path / "s").as_uri(), pa.schema([("a", pa.int32())]), upper=20)
    s.evolve(SchemaChange(kind="add", name="c", type="string"))
    _seal(s, 20, 40)
    s.evolve(SchemaChange(kind="drop", name="c"))
    header = s.admin().head().header
    bs = [_batch(0), _batch(1), _batch(2, schema_id=1), _batch(3, schema_id=1), _batch(4, schema_id=2),
          _batch(5, schema_id=2), _batch(6, correction=True, schema_id=2), _batch(7, schema_id=2),
          _batch(8, schema_id=2)]
    assert [bool(visible_drops(header, b, 0)) for b in bs[:5]] == [False, False, True, True, False]
    runs = schedule_merges(bs, ScheduleOptions(min_rows=8), header=header)
    assert runs == [tuple(bs[:2]), tuple(bs[2:4]), tuple(bs[4:6]), tuple(bs[7:])]
    assert [merge_target(header, r, 0).id for r in runs] == [2, 1, 2, 2]
    assert schedule_merges(bs, ScheduleOptions(min_rows=8), header=header, since=40) == [tuple(bs[:6]), tuple(bs[7:])]
    unknown = BatchMeta("dx", 90, 100, 10, bs[0].parts, schema_id=7)
    assert schedule_merges([bs[7], unknown, bs[8]], ScheduleOptions(min_rows=8), header=header) == []
    with pytest.raises(CorruptionError, match="names schema id 7, which the state does not hold"):
        merge_target(header, [bs[8], unknown], 0)
