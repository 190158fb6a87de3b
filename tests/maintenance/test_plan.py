"""The compaction plan (pure): size-tiered runs, and corrections kept apart."""

from __future__ import annotations

from shardsink.core.state import BatchMeta, PartMeta
from shardsink.maintenance.plan import PlanOptions, plan_merges


def _batch(i: int, *, correction: bool = False) -> BatchMeta:
    key = f"parts/d{i}/corrects-0_10/p.parquet" if correction else f"parts/d{i}/p.parquet"
    return BatchMeta(f"d{i}", 10 * i, 10 * (i + 1), i + 1, (PartMeta(key, 1, 100, 10 * i, 10 * i),))


def test_small_batches_merge_into_one_run() -> None:
    batches = [_batch(i) for i in range(6)]
    assert plan_merges(batches, PlanOptions(min_rows=8)) == [tuple(batches)]


def test_batches_holding_corrections_are_never_merged_nor_merged_across() -> None:
    """Re-processing finds earlier corrections by their parts' key label: a merge would erase it
    and a re-run of the range would apply the same correction twice."""
    batches = [_batch(0), _batch(1), _batch(2, correction=True), _batch(3), _batch(4), _batch(5)]
    runs = plan_merges(batches, PlanOptions(min_rows=8))
    assert runs == [tuple(batches[:2]), tuple(batches[3:])]
    assert all(not any("/corrects-" in p.key for b in run for p in b.parts) for run in runs)
