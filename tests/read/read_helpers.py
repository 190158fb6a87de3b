"""Helpers of the engine reader tests: a shard with a history, an independent model of it,
and engine results as comparable multisets.

The model is pure Python over the updates the test wrote (never the library's reads):
a row's identity canonicalises floats (``-0.0`` is ``0.0``, every NaN is one NaN), a
snapshot at ``t`` sums ``_diff`` over ``_time <= t``, a change feed ``[lo, hi)`` sums per
``(row, max(_time, since))`` over the advanced times in range.

:func:`decanonicalise` rewrites every part by hand with ``-0.0`` for ``0.0`` and a NaN with
another payload for NaN (with Parquet statistics on every column), as a part written
before the float rule or by another writer: what the engines must normalise.
"""

from __future__ import annotations

import io
import math
import random
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink import Shard
from shardsink.core.schema import SchemaChange

# The float column first: Parquet statistics of the first column are written, which once
# made DuckDB fold isnan() to false (see shardsink.read.duckdb_read).
SCHEMA = pa.schema([("x", pa.float64()), ("k", pa.string()), ("n", pa.int64())])
FLOATS = [0.0, -0.0, float("nan"), 1.5, -2.25, None]
CANONICAL_NAN = 0x7FF8000000000000
ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000123))[0]
NAN_KEY = "NaN"


def bits(v: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", v))[0])


def key_of(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row's identity: floats canonical, NaN as one hashable token."""
    out = []
    for v in row:
        if isinstance(v, float):
            v = NAN_KEY if math.isnan(v) else v + 0.0
        out.append(v)
    return tuple(out)


@dataclass
class Model:
    """Every update written: ``(row, time, diff)``; ``since`` as the test advanced it."""

    updates: list[tuple[tuple[Any, ...], int, int]] = field(default_factory=list)
    since: int = 0

    def snapshot(self, as_of: int) -> Counter[tuple[Any, ...]]:
        out: Counter[tuple[Any, ...]] = Counter()
        for row, t, d in self.updates:
            if t <= as_of:
                out[key_of(row)] += d
        return Counter({k: v for k, v in out.items() if v != 0})

    def changes(self, lower: int, upper: int) -> Counter[tuple[Any, ...]]:
        out: Counter[tuple[Any, ...]] = Counter()
        for row, t, d in self.updates:
            t = max(t, self.since)
            if lower <= t < upper:
                out[(*key_of(row), t)] += d
        return Counter({k: v for k, v in out.items() if v != 0})


def write_history(shard: Shard, model: Model, *, batches: int, seed: int, span: int = 10,
                  floats: Sequence[float | None] = tuple(FLOATS)) -> None:
    """``batches`` appends of random rows (inserts, then retractions of live rows) at ``span`` each."""
    rng = random.Random(seed)
    upper = shard.info().upper
    assert upper is not None
    for _ in range(batches):
        live = model.snapshot(upper + span)
        rows: list[tuple[tuple[Any, ...], int, int]] = []
        for _ in range(rng.randint(3, 12)):
            row = (rng.choice(floats), rng.choice(["a", "b", "c", None]), rng.choice([1, 2, None]))
            rows.append((row, upper + rng.randrange(span), rng.choice([1, 1, 2])))
        for k in rng.sample(sorted(live, key=repr), min(len(live), rng.randint(0, 3))):
            row = tuple(float("nan") if v == NAN_KEY else v for v in k)
            rows.append((row, upper + rng.randrange(span), -rng.randint(1, live[k])))
        table = pa.table({"x": pa.array([r[0][0] for r in rows], pa.float64()),
                          "k": pa.array([r[0][1] for r in rows], pa.string()),
                          "n": pa.array([r[0][2] for r in rows], pa.int64()),
                          "_time": [r[1] for r in rows], "_diff": [r[2] for r in rows]})
        shard.append(table, lower=upper, upper=upper + span)
        model.updates.extend(rows)
        upper += span


def decanonicalise(shard: Shard) -> int:
    """Rewrite every live part with ``-0.0`` and an odd NaN payload; returns how many changed."""
    changed = 0
    for b in shard.batches():
        for p in b.parts:
            got = shard._machine.blob.get(p.key)
            assert got is not None
            t = pq.read_table(pa.BufferReader(got.data))
            x = t.column("x")
            zero = pc.fill_null(pc.equal(x, 0.0), False)
            nan = pc.fill_null(pc.is_nan(x), False)
            if not (pc.any(zero).as_py() or pc.any(nan).as_py()):
                continue
            x = pc.if_else(zero, pa.scalar(-0.0), pc.if_else(nan, pa.scalar(ODD_NAN), x))
            t = t.set_column(0, t.schema.field(0), x)
            buf = io.BytesIO()
            pq.write_table(t, buf)  # statistics on every column, the float one too
            shard._machine.blob.put(p.key, buf.getvalue())
            changed += 1
    return changed


def as_counter(rows: Iterable[Sequence[Any]]) -> Counter[tuple[Any, ...]]:
    """Result rows ``(*key, value)`` as a multiset ``{key: value}``; asserts unique keys and
    canonical floats (``+0.0``, the one quiet NaN)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        for v in r[:-1]:
            if isinstance(v, float) and v == 0.0:
                assert bits(v) == 0, f"-0.0 in a result row {r}"
            if isinstance(v, float) and math.isnan(v):
                assert bits(v) == CANONICAL_NAN, f"non-canonical NaN {bits(v):#x} in a result row {r}"
        k = key_of(r[:-1])
        assert k not in out, f"row {r} appears twice"
        out[k] = r[-1]
    return out


def core_counter(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return as_counter(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)), strict=True))


EVOLVED = pa.schema([pa.field("k", pa.int32()), pa.field("v", pa.string()), pa.field("y", pa.float64()),
                     pa.field("z", pa.string())])


def evolved(url: str) -> Shard:
    """Four schema changes, a batch under each schema id: ``add note`` at 10, ``rename v:w``
    at 20, ``widen k:int64`` and ``drop z`` at 30 (schema ids 0, 1, 2, 4 hold batches)."""
    s = Shard.create(url, EVOLVED)
    i32 = pa.int32()
    s.append(pa.table({"k": pa.array([1, 2, 3], i32), "v": ["a", "b", "c"], "y": [0.5, -0.0, float("nan")],
                       "z": ["p", "q", None], "_time": [0, 1, 2], "_diff": [1, 1, 1]}), lower=0, upper=10)
    s.evolve(SchemaChange(kind="add", name="note", type="string"))
    s.append(pa.table({"k": pa.array([4, 1], i32), "v": ["d", "a"], "y": [1.0, 0.5], "z": ["r", "p"],
                       "note": ["n4", None], "_time": [10, 11], "_diff": [1, -1]}), lower=10, upper=20)
    s.evolve(SchemaChange(kind="rename", name="v", new_name="w"))
    s.append(pa.table({"k": pa.array([5], i32), "w": ["e"], "y": [2.0], "z": ["s"], "note": ["n5"],
                       "_time": [20], "_diff": [1]}), lower=20, upper=30)
    s.evolve(SchemaChange(kind="widen", name="k", type="int64"))
    s.evolve(SchemaChange(kind="drop", name="z"))
    s.append(pa.table({"k": pa.array([2**40, 2], pa.int64()), "w": ["f", "b"], "y": [3.0, 0.0], "note": ["n6", None],
                       "_time": [30, 31], "_diff": [2, 1]}), lower=30, upper=40)
    return s
