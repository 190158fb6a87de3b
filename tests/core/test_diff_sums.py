"""Exact ``_diff`` sums (core/diff_sums.py) and the consolidation built on them: a sum whose
running total leaves int64 but ends inside it is exact, a final sum outside int64 is a
CorruptionError naming where (never a wrapped value, never "negative multiplicity"), and a
chunk's partial sums stay exact."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from shardsink import CorruptionError
from shardsink.core.consolidate import consolidate, consolidate_partial
from shardsink.core.diff_sums import group_sums, may_overflow, run_sums

BIG = 2**62
I64 = (-(2**63), 2**63 - 1)


def updates(rows: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"k": [k for k, _ in rows], "_diff": pa.array([d for _, d in rows], pa.int64())})


def as_dict(t: pa.Table, name: str = "_diff") -> dict[str, int]:
    return dict(zip(t["k"].to_pylist(), t[name].to_pylist(), strict=True))


@pytest.mark.parametrize("n, sign", [(4, 1), (3, 1), (2, 1), (3, -1)], ids=["2**64", "3*2**62", "2**63", "-3*2**62"])
def test_a_sum_outside_int64_is_corruption_naming_where_never_wrapped(n: int, sign: int) -> None:
    t = updates([("a", sign * BIG)] * n + [("b", 1)])
    total = sign * BIG * n
    for call in (lambda: consolidate(t, ["k"], where="shard X changes [0, 9)"),
                 lambda: group_sums(t, ["k"], name="_count", where="shard X changes [0, 9)")):
        with pytest.raises(CorruptionError, match=r"shard X changes \[0, 9\) has 1 rows whose _\w+ sum overflows "
                                                  rf"int64, e.g. {total}$"):
            call()


def test_a_running_total_past_int64_that_ends_inside_it_is_exact() -> None:
    rows = [("a", BIG), ("a", BIG), ("a", BIG), ("a", -BIG), ("a", -BIG), ("b", 1), ("b", 2), ("c", -(2**63))]
    t = updates(rows)
    assert as_dict(consolidate(t, ["k"])) == {"a": BIG, "b": 3, "c": -(2**63)}
    assert as_dict(group_sums(t, ["k"], name="_count", where="w"), "_count") == {"a": BIG, "b": 3, "c": -(2**63)}
    edge = updates([("a", 2**63 - 1), ("a", 2**63 - 1), ("a", -(2**63 - 1))])      # ends at the int64 maximum
    assert as_dict(consolidate(edge, ["k"])) == {"a": 2**63 - 1}
    with pytest.raises(CorruptionError, match=f"e.g. {2**63}$"):                       # one past it
        consolidate(updates([("a", 2**63 - 1), ("a", 1)]), ["k"])


def test_a_wrapped_zero_is_not_dropped_as_a_retraction() -> None:
    """Four updates of 2**62 wrap to exactly 0: the old sum dropped the row as cancelled out."""
    with pytest.raises(CorruptionError, match="overflows int64"):
        consolidate(updates([("a", BIG)] * 4), ["k"])


@pytest.mark.parametrize("seed", range(6))
def test_exact_sums_equal_python_integers_on_random_huge_diffs(seed: int) -> None:
    rng = random.Random(seed)
    rows = [(f"k{rng.randrange(8)}", rng.choice([1, -1, BIG, -BIG, 2**63 - 1, -(2**63), rng.randrange(-BIG, BIG)]))
            for _ in range(rng.randrange(2, 40))]
    want: Counter[str] = Counter()
    for k, d in rows:
        want[k] += d
    over = {k: v for k, v in want.items() if not I64[0] <= v <= I64[1]}
    t = updates(rows)
    if over:
        with pytest.raises(CorruptionError, match=f"has {len(over)} rows whose _diff sum overflows int64"):
            consolidate(t, ["k"])
        got, exact = consolidate_partial(t, ["k"], where="w")
        assert not exact
        assert {k: sum(d for kk, d in zip(got["k"].to_pylist(), got["_diff"].to_pylist(), strict=True) if kk == k)
                for k in over} == over, "a chunk's partial sums stay exact: the rows are kept unsummed"
        assert got["k"].to_pylist() == sorted(got["k"].to_pylist())
    else:
        assert as_dict(consolidate(t, ["k"])) == {k: v for k, v in want.items() if v}
        assert consolidate_partial(t, ["k"], where="w")[1]


def test_partial_sums_of_chunks_consolidate_to_the_exact_total() -> None:
    """A chunk whose sum leaves int64 is no error (the total may not): its rows are kept, and
    consolidating the chunks together gives the exact total, or the error if it leaves int64."""
    first, exact = consolidate_partial(updates([("a", BIG), ("a", BIG), ("b", 1), ("b", 1)]), ["k"], where="w")
    assert not exact and first.to_pylist() == [{"k": "a", "_diff": BIG}, {"k": "a", "_diff": BIG},
                                               {"k": "b", "_diff": 2}]
    second = consolidate(updates([("a", -BIG), ("a", -BIG), ("a", 5)]), ["k"])
    assert as_dict(consolidate(pa.concat_tables([first, second]), ["k"])) == {"a": 5, "b": 2}
    with pytest.raises(CorruptionError, match=f"e.g. {2**63}$"):
        consolidate(first, ["k"])


def test_small_diffs_take_the_plain_sum_and_the_bound_is_exact() -> None:
    assert not may_overflow(pa.array([1, -1] * 1000, pa.int64()))
    assert not may_overflow(pa.array([2**61] * 3, pa.int64()))               # 3 * 2**61 < 2**63
    assert may_overflow(pa.array([2**61] * 4, pa.int64()))                   # 4 * 2**61 = 2**63: may leave
    assert may_overflow(pa.array([2**62, 1], pa.int64()))
    assert not may_overflow(pa.array([-(2**63)], pa.int64()))                # one row never overflows
    sums, over = run_sums(pa.array([1, 2, 3, 4], pa.int64()), np.array([0, 2]), where="w")
    assert sums.tolist() == [3, 7] and over is None
