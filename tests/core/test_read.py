"""The pyarrow reads of core/read.py (ReadHandle.snapshot / changes) on both backends:
``_diff`` sums never wrap (as the DuckDB and Polars readers), and an ``as_of`` read filters by
time before projecting onto the older schema, so it works on a compacted shard."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from shardsink import CorruptionError, Shard
from shardsink.core.schema import SchemaChange
from shardsink.maintenance import advance_since, compact_batches

BIG = 2**62


def rows(t: pa.Table) -> dict[tuple[object, ...], int]:
    names = [n for n in t.column_names if n not in ("_count", "_diff")]
    last = "_count" if "_count" in t.column_names else "_diff"
    return {tuple(r[n] for n in names): r[last] for r in t.to_pylist()}


def test_diff_sums_past_int64_fail_the_read_naming_the_shard_never_wrap(shard_url: str) -> None:
    """Diffs of 2**62 in six parts (times 0..50: +, +, -, +, +, +). As of 29 the running total
    passed int64 but ends at 2**62: exact. As of 39 (2**63) and 49 (3 * 2**62) the sum leaves
    int64: the old sum wrapped negative ("negative multiplicity"); as of 59 (2**64) it wrapped
    to 0 and the row silently vanished."""
    shard = Shard.create(shard_url, pa.schema([("k", pa.string())]))
    for i, d in enumerate((BIG, BIG, -BIG, BIG, BIG, BIG)):
        shard.append(pa.table({"k": ["a", "b"], "_time": [10 * i, 10 * i + 5], "_diff": [d, 1]}),
                     lower=10 * i, upper=10 * i + 10)
    assert rows(shard.snapshot(29)) == {("a",): BIG, ("b",): 3}
    for as_of, total in ((39, 2**63), (49, 3 * BIG), (59, 2**64)):
        with pytest.raises(CorruptionError, match=f"^shard {re.escape(shard_url)} as of {as_of} has 1 rows whose "
                                                  f"_count sum overflows int64, e.g. {total}$"):
            shard.snapshot(as_of)
    advance_since(shard, target=20)                                        # times 0, 10 read as 20
    assert rows(shard.changes(20, 40)) == {("a", 20): BIG, ("b", 20): 2, ("b", 25): 1, ("a", 30): BIG,
                                           ("b", 35): 1}
    advance_since(shard, target=40)                                        # 0..30 read as 40: 3 * 2**62
    with pytest.raises(CorruptionError, match=rf"^shard {re.escape(shard_url)} changes \[40, 60\) has 1 rows whose "
                                              f"_diff sum overflows int64, e.g. {3 * BIG}$"):
        shard.changes(40, 60)


def _widened(url: str) -> Shard:
    """k int32 at times 0..9, widened to int64 at 10, then ``k = 2**40`` at 10."""
    s = Shard.create(url, pa.schema([("k", pa.int32()), ("v", pa.string())]))
    s.append(pa.table({"k": pa.array([1, 2], pa.int32()), "v": ["a", "b"], "_time": [0, 5], "_diff": [1, 1]}),
             lower=0, upper=10)
    s.evolve(SchemaChange(kind="widen", name="k", type="int64"))
    s.append(pa.table({"k": pa.array([2**40, 2], pa.int64()), "v": ["c", "b"], "_time": [10, 12], "_diff": [1, -1]}),
             lower=10, upper=20)
    return s


def test_an_as_of_read_of_a_compacted_shard_filters_by_time_before_narrowing(shard_url: str) -> None:
    shard = _widened(shard_url)
    before = {as_of: shard.snapshot(as_of, schema="as_of") for as_of in (5, 19)}
    changes_before = shard.changes(0, 10, schema="as_of")
    res = compact_batches(shard, shard.reader().batches(), since=shard.info().since)
    assert res.status == "applied" and len(shard.reader().batches()) == 1      # one part, k int64, 2**40 at 10
    old = shard.snapshot(5, schema="as_of")                                     # raised ArrowInvalid before
    assert old.schema.field("k").type == pa.int32()
    assert old.sort_by("k").equals(before[5].sort_by("k"))
    assert rows(old) == {(1, "a"): 1, (2, "b"): 1}
    assert shard.snapshot(19, schema="as_of").sort_by("k").equals(before[19].sort_by("k"))
    assert rows(shard.snapshot(19, schema="as_of")) == {(1, "a"): 1, (2**40, "c"): 1}
    got = shard.changes(0, 10, schema="as_of")
    assert got.schema.field("k").type == pa.int32() and got.equals(changes_before)
