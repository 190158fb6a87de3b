"""core/small_sort: a small table's order and adjacent-equal mask are exactly Arrow's stable sort
(nulls last) and consolidate's mask, for every key type it takes; any other type or size is left
to the vectorised path."""

from __future__ import annotations

import random
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardsink.core.consolidate import _adjacent_same, consolidate
from shardsink.core.small_sort import SMALL_ROWS, small_order

_WORDS = ["", "a", "ab", "b", "é", "z", "\U0001f600", "A"]


def _column(kind: str, n: int, rng: random.Random) -> pa.Array:
    def maybe(v: object) -> object:
        return None if rng.random() < 0.15 else v

    if kind == "int64":
        return pa.array([maybe(rng.randint(-3, 3)) for _ in range(n)], pa.int64())
    if kind == "int8":
        return pa.array([maybe(rng.randint(-2, 2)) for _ in range(n)], pa.int8())
    if kind == "bool":
        return pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_())
    if kind == "timestamp":
        return pa.array([maybe(datetime(2024, 1, rng.randint(1, 3))) for _ in range(n)], pa.timestamp("ms", "UTC"))
    if kind == "date":
        return pa.array([maybe(date(2024, 1, rng.randint(1, 3))) for _ in range(n)], pa.date32())
    if kind == "string":
        return pa.array([maybe(rng.choice(_WORDS)) for _ in range(n)], pa.string())
    if kind == "binary":
        return pa.array([maybe(rng.choice(_WORDS).encode()) for _ in range(n)], pa.binary())
    assert kind == "dictionary"
    return pa.array([maybe(rng.choice(_WORDS)) for _ in range(n)], pa.string()).dictionary_encode()


KINDS = ["int64", "int8", "bool", "timestamp", "date", "string", "binary", "dictionary"]


@pytest.mark.parametrize("seed", range(40))
def test_the_order_and_the_mask_are_arrows_stable_sort_and_consolidates_mask(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        n = rng.randint(2, SMALL_ROWS)
        keys = [f"k{i}" for i in range(rng.randint(1, 3))]
        table = pa.table({k: _column(rng.choice(KINDS), n, rng) for k in keys} | {"_diff": pa.array([1] * n)})
        got = small_order(table, keys)
        assert got is not None, table.schema
        order, same = got
        plain = pa.table({k: (table[k].cast(table[k].type.value_type) if pa.types.is_dictionary(table[k].type)
                              else table[k]) for k in keys})
        want = pc.sort_indices(plain, sort_keys=[(k, "ascending", "at_end") for k in keys])
        assert order.to_pylist() == want.to_pylist(), (table.schema, table.to_pylist())
        want_same = _adjacent_same(plain.take(want), keys)
        if want_same is None:
            assert same is None
        else:
            assert same is not None and np.asarray(want_same).tolist() == same.tolist()


def test_floats_other_types_and_other_sizes_are_left_to_the_vectorised_path() -> None:
    assert small_order(pa.table({"k": pa.array([0.0, -0.0, float("nan")])}), ["k"]) is None
    assert small_order(pa.table({"k": pa.array([1, 2], pa.decimal128(5, 2))}), ["k"]) is None
    assert small_order(pa.table({"k": pa.array([1])}), ["k"]) is None
    assert small_order(pa.table({"k": pa.array(range(SMALL_ROWS + 1))}), ["k"]) is None
    repeated = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["x", "x"]))
    assert small_order(pa.table({"k": repeated}), ["k"]) is None  # one value under two indices


def test_consolidate_of_a_small_table_sums_duplicates_and_drops_zeros_as_before() -> None:
    table = pa.table({"k": pa.array(["b", None, "a", "b", None, "a"]), "_diff": pa.array([1, 2, 1, -1, 1, 2])})
    out = consolidate(table, ["k"])
    assert out.to_pylist() == [{"k": "a", "_diff": 3}, {"k": None, "_diff": 3}]
