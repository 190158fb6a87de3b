"""The fast multi-key sort of consolidation gives exactly Arrow's stable order, with its
tie handling (wide prefixes with few ties, many tied prefixes, nulls, NaN, -0.0)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core import consolidate as cs

KEYS = ["i", "f", "s", "_time"]
VALUES: dict[str, list[Any]] = {"i": [None, -1, 0, 2], "f": [None, math.nan, -0.0, 0.0, 1.5, -2.0],
                                "s": [None, "", "a", "ab", "é"]}


def _random_updates(rng: random.Random, n: int) -> pa.Table:
    return pa.table({
        "i": pa.array([rng.choice(VALUES["i"]) for _ in range(n)], pa.int64()),
        "f": pa.array([rng.choice(VALUES["f"]) for _ in range(n)], pa.float64()),
        "s": pa.array([rng.choice(VALUES["s"]) for _ in range(n)], pa.string()),
        "_time": pa.array([rng.randint(0, 2) for _ in range(n)], pa.int64()),
        "_diff": pa.array([rng.choice([-1, 1, 2]) for _ in range(n)], pa.int64()),
    })


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r.values()) for r in t.to_pylist()]


def test_consolidate_equals_arrow_group_by_then_sort_for_nulls_nans_and_zero_sums() -> None:
    rng = random.Random(1)
    order = [(k, "ascending", "at_end") for k in KEYS]
    for _ in range(400):
        t = _random_updates(rng, rng.randint(0, 40))
        # consolidate treats -0.0 and 0.0 as one value (as Arrow's sort and pc.equal do); group_by hashes bits
        plus_zero = t.set_column(1, "f", pc.add(t["f"], 0.0))
        model = plus_zero.group_by(KEYS, use_threads=False).aggregate([("_diff", "sum")])
        model = model.rename_columns([*KEYS, "_diff"])
        model = model.filter(pc.not_equal(model["_diff"], 0))
        model = model.take(pc.sort_indices(model, sort_keys=order)).select(t.column_names)
        assert _rows(cs.consolidate(t, KEYS)) == _rows(model)


def test_multi_key_sort_with_ties_beyond_64_bits_matches_arrow() -> None:
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(2, 2500))
        base = rng.integers(0, 60, n) if trial % 2 else np.arange(n)  # odd trials: many tied prefixes
        cols = {f"f{c}": pa.array((rng.random(300) * 1e6)[(base * (c + 7) + c) % 300]) for c in range(6)}
        cols.update({f"g{c}": pa.array(rng.random(300)[rng.integers(0, 300, n)]) for c in range(2)})
        cols["_time"] = pa.array(rng.integers(0, 3, n), pa.int64())
        t = pa.table(cols)
        got = cs._sort_order(t, list(cols))
        assert got is not None
        want = pc.sort_indices(t, sort_keys=[(k, "ascending", "at_end") for k in cols])
        assert got[0].to_pylist() == want.to_pylist()


def test_sorting_only_the_rows_a_wide_prefix_ties_matches_arrow(monkeypatch: Any) -> None:
    """Few rows tie on the keys that fit one packed sort: only those rows are sorted by the
    later keys (nested when the later keys tie too), and the order is still Arrow's."""
    calls = []
    resolve = cs._resolve_ties
    monkeypatch.setattr(cs, "_resolve_ties", lambda *a: calls.append(len(a[1])) or resolve(*a))
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1000, 6000))
        wide = rng.integers(0, 1 << 40, n)
        dup = rng.integers(0, n, n // 20)  # 5% of rows copy another row's prefix
        wide[dup] = wide[rng.integers(0, n, len(dup))]
        mid = rng.integers(0, 1 << 30, n)
        mid[dup[: len(dup) // 2]] = 7  # and some of those tie on the next keys as well
        t = pa.table({
            "a": pa.array(wide, pa.int64()),
            "b": pa.array(rng.integers(0, 1 << 20, n) * (trial % 2), pa.int64()),  # odd trials: b breaks no tie
            "c": pa.array(mid, pa.int64()),
            "s": pa.array(rng.choice(np.array([None, "", "x", "é"], dtype=object), n), pa.string()),
            "f": pa.array(rng.choice([math.nan, -0.0, 0.0, 1.5], n), pa.float64()),
            "_time": pa.array(rng.integers(0, 3, n), pa.int64()),
        })
        got = cs._sort_order(t, t.column_names)
        assert got is not None
        want = pc.sort_indices(t, sort_keys=[(k, "ascending", "at_end") for k in t.column_names])
        assert got[0].to_pylist() == want.to_pylist()
    assert len(calls) >= 40 and min(calls) < 1000  # the path ran, on a few hundred rows each
