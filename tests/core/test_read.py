"""The pyarrow reads of core/read.py (ReadHandle.snapshot / changes, and read_batch_parts: parts as
stored under a lease) on both backends:
``_diff`` sums never wrap (as the DuckDB and Polars readers), and an ``as_of`` read filters by
time before projecting onto the older schema, so it works on a compacted shard."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from shardsink import CorruptionError, Shard
from shardsink.core.schema import SchemaChange
from shardsink.errors import ReadFrontierError
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


def _three_batches(url: str) -> Shard:
    s = Shard.create(url, pa.schema([("k", pa.string())]))
    for i in range(3):
        s.append(pa.table({"k": [f"k{i}"], "_time": [10 * i + 1], "_diff": [1]}), lower=10 * i, upper=10 * i + 10)
    return s


def test_a_read_of_parts_as_stored_is_planned_on_the_version_its_lease_pinned(
        shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_batch_parts: core/plan.py picks the parts (every live one, or those named) on the
    version read after its lease; the lease (at since, by its holder) lives exactly as long as the read."""
    shard = _three_batches(shard_url)
    advance_since(shard, target=15)  # times stay as stored: 1 and 11 are not advanced to 15
    r = shard.reader()
    seen: list[list[tuple[str, int]]] = []
    real = type(r).read_plan

    def spying(self, plan):  # type: ignore[no-untyped-def]
        seen.append([(x.holder, x.as_of) for x in shard.leases()])
        return real(self, plan)

    monkeypatch.setattr(type(r), "read_plan", spying)
    v, t = r.read_batch_parts(holder="judge")
    assert v.seqno == shard.info().seqno and seen == [[("judge", 15)]] and shard.leases() == []
    assert rows(t) == {("k0", 1): 1, ("k1", 11): 1, ("k2", 21): 1}
    second = shard.batches()[1].parts[0].key
    assert rows(r.read_batch_parts([second])[1]) == {("k1", 11): 1}
    with pytest.raises(CorruptionError, match=r"part parts/gone/x\.parquet of .* left the state while being read"):
        r.read_batch_parts([second, "parts/gone/x.parquet"])
    assert shard.leases() == [], "a failed read released its lease"


def test_a_read_of_parts_as_stored_retakes_its_lease_when_since_moved_on(
        shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's head says since 0; a compactor advanced it to 15 before the lease: the read
    holds no time, so it takes its lease again at 15 instead of refusing."""
    shard = _three_batches(shard_url)
    stale = shard.reader().head()
    advance_since(shard, target=15)
    _, t = shard.reader().read_batch_parts(head=stale)
    assert t.num_rows == 3 and shard.leases() == []
    monkeypatch.setattr("shardsink.core.plan._PIN_ATTEMPTS", 1)  # no second try: the lease's re-check refuses
    with pytest.raises(ReadFrontierError, match="before since"):
        shard.reader().read_batch_parts(head=stale)
    assert shard.leases() == []
