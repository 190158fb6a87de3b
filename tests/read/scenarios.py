"""The guarantees every engine reader must keep, as functions over an :class:`Engine`
(tests/read/test_duckdb.py and test_polars.py run them on both backends)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from read_helpers import NAN_KEY, SCHEMA, Model, as_counter, core_counter, decanonicalise, evolved, write_history

from shardsink import CorruptionError, Shard
from shardsink.maintenance.compact import compact_batches
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.since import advance_since
from shardsink.read import LeasedRead


@dataclass(frozen=True)
class Engine:
    """``read(url, as_of, changes)``: the engine reader; ``rows(engine object)``: its result
    rows as tuples in the plan's column order; ``arrow``: its result as an Arrow table;
    ``corruption``: what a failed corruption check raises (DuckDB: its error, message
    ``CorruptionError: ...``)."""

    read: Callable[..., LeasedRead[Any]]
    rows: Callable[[Any], Sequence[tuple[Any, ...]]]
    arrow: Callable[[Any], pa.Table]
    corruption: type[Exception] = CorruptionError

    def snapshot(self, url: str, as_of: int | None = None) -> Counter[tuple[Any, ...]]:
        with self.read(url, as_of) as value:
            return as_counter(self.rows(value))

    def changes(self, url: str, lower: int, upper: int) -> Counter[tuple[Any, ...]]:
        with self.read(url, changes=(lower, upper)) as value:
            return as_counter(self.rows(value))


def snapshots_and_changes_equal_the_model(engine: Engine, url: str) -> None:
    shard = Shard.create(url, SCHEMA)
    model = Model()
    write_history(shard, model, batches=6, seed=7)                 # times [0, 60)
    assert decanonicalise(shard) > 0                               # -0.0 and odd NaNs in the parts
    for as_of in (None, 0, 9, 10, 33, 59):
        want = model.snapshot(59 if as_of is None else as_of)
        got = engine.snapshot(url, as_of)
        assert got == want, f"snapshot as of {as_of}"
        assert got == core_counter(shard.snapshot(as_of))
    assert any(v > 1 for v in model.snapshot(59).values())          # multiplicities, not just sets
    for lo, hi in ((0, 60), (0, 1), (10, 35), (33, 33), (59, 60), (5, 15)):
        assert engine.changes(url, lo, hi) == model.changes(lo, hi) == core_counter(shard.changes(lo, hi)), (lo, hi)
    # Advance since, compact everything (times below since are stored as since): same answers.
    advance_since(shard, target=25)
    model.since = 25
    merge = compact_batches(shard, shard.batches(), since=25)
    assert merge.status == "applied"
    write_history(shard, model, batches=2, seed=8)                 # times [60, 80), after the compaction
    for as_of in (25, 40, 79):
        assert engine.snapshot(url, as_of) == model.snapshot(as_of), f"compacted snapshot as of {as_of}"
    for lo, hi in ((25, 80), (25, 26), (30, 70), (60, 80)):
        assert engine.changes(url, lo, hi) == model.changes(lo, hi) == core_counter(shard.changes(lo, hi)), (lo, hi)


def floats_without_nulls_are_normalised(engine: Engine, url: str) -> None:
    """A part whose float column has no nulls: DuckDB once folded ``isnan(x)`` to false from
    its Parquet statistics (which exclude NaN), leaving NaN payloads and -0.0 unnormalised."""
    shard = Shard.create(url, SCHEMA)
    model = Model()
    write_history(shard, model, batches=1, seed=11, floats=(0.0, float("nan"), 1.5))
    assert decanonicalise(shard) > 0
    assert engine.snapshot(url) == model.snapshot(9)
    assert engine.changes(url, 0, 10) == model.changes(0, 10)
    # One float key alone (Polars' multi-key grouping happens to canonicalise; one key does not).
    one = Shard.create(f"{url}-one", pa.schema([("x", pa.float64())]))
    one.append(pa.table({"x": [0.0, 0.0, float("nan"), float("nan"), 1.5], "_time": [0, 1, 2, 3, 3],
                         "_diff": [1, 1, 1, 2, 1]}), lower=0, upper=10)
    assert decanonicalise(one) == 1
    assert engine.snapshot(one.url) == Counter({(0.0,): 2, (NAN_KEY,): 3, (1.5,): 1})
    assert engine.changes(one.url, 0, 10) == Counter({(0.0, 0): 1, (0.0, 1): 1, (NAN_KEY, 2): 1, (NAN_KEY, 3): 2,
                                                       (1.5, 3): 1})


def gc_cannot_delete_a_part_under_a_reader(engine: Engine, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small idempotency window and rollup cadence (as tests/maintenance/gc_helpers.py): a few
    # commits after the compaction take its input versions out of every window but the lease's.
    monkeypatch.setattr("shardsink.core.transitions.RECENT_DESCS", 4)
    monkeypatch.setattr("shardsink.core.machine.ROLLUP_EVERY", 4)
    shard = Shard.create(url, SCHEMA)
    model = Model()
    write_history(shard, model, batches=4, seed=3)
    reader = engine.read(url, 39)
    pinned = {r.part.key for r in reader.plan.parts}
    assert pinned and shard.leases()
    merge = compact_batches(shard, shard.batches(), since=0)       # every pinned part is now unreferenced
    assert merge.status == "applied" and not pinned & {p.key for b in shard.batches() for p in b.parts}
    write_history(shard, model, batches=6, seed=4)
    collect(shard, GcOptions(grace_s=0, retention=1))
    assert all(shard._machine.blob.get(k) is not None for k in pinned), "GC deleted a part under a live reader"
    assert as_counter(engine.rows(reader.value)) == model.snapshot(39)  # still materialises
    reader.close()
    assert not shard.leases()
    collect(shard, GcOptions(grace_s=0, retention=1))
    assert all(shard._machine.blob.get(k) is None for k in pinned)          # without the lease GC takes them


def lease_lives_as_long_as_the_returned_object(engine: Engine, url: str) -> None:
    shard = Shard.create(url, SCHEMA)
    write_history(shard, Model(), batches=1, seed=1)
    with engine.read(url) as value:
        assert len(shard.leases()) == 1
        engine.rows(value)
    assert not shard.leases()                                      # the block released it
    kept = engine.read(url, changes=(0, 10))
    value = kept.value
    del kept
    gc.collect()
    assert len(shard.leases()) == 1                                # the relation/frame is still referenced
    del value
    gc.collect()
    assert not shard.leases()                                      # collected: released


def as_of_schema_reads_equal_the_pyarrow_reads(engine: Engine, url: str) -> None:
    """``schema="as_of"`` after add (10), rename (20), widen + drop (30): the engine's columns,
    the widened column's type and rows equal ``Shard.snapshot/changes(schema="as_of")``."""
    shard = evolved(url)

    def same(got: pa.Table, want: pa.Table, what: str) -> None:
        assert got.column_names == want.column_names, what
        assert got.schema.field("k").type == want.schema.field("k").type, what
        assert core_counter(got) == core_counter(want), what

    expected = {5: ["k", "v", "y", "z"], 15: ["k", "v", "y", "z", "note"], 29: ["k", "w", "y", "z", "note"],
                39: ["k", "w", "y", "note"]}
    for as_of, names in expected.items():
        want = shard.snapshot(as_of, schema="as_of")
        assert want.column_names == [*names, "_count"]                      # the pyarrow read's schema
        with engine.read(url, as_of, schema="as_of") as value:
            same(engine.arrow(value), want, f"snapshot as of {as_of}")
    assert shard.snapshot(29, schema="as_of").schema.field("k").type == pa.int32()   # narrower before 30
    for lo, hi in ((0, 40), (0, 25), (10, 20), (15, 15)):
        with engine.read(url, changes=(lo, hi), schema="as_of") as value:
            same(engine.arrow(value), shard.changes(lo, hi, schema="as_of"), f"changes [{lo}, {hi})")
    with engine.read(url, 15) as value:                                     # the default stays current
        assert engine.arrow(value).column_names == ["k", "w", "y", "note", "_count"]


def diff_sums_never_wrap(engine: Engine, url: str) -> None:
    """Diffs of 2**62 in five parts (times 0..40: +, +, -, +, +): a sum whose running total
    passes int64 but ends inside it reads exactly (as the pyarrow read); a sum outside int64
    fails the read (corruption check) instead of wrapping."""
    big = 2**62
    shard = Shard.create(url, pa.schema([("k", pa.string())]))
    for i, d in enumerate((big, big, -big, big, big)):
        shard.append(pa.table({"k": ["a", "b"], "_time": [10 * i, 10 * i + 5], "_diff": [d, 1]}),
                     lower=10 * i, upper=10 * i + 10)
    want = {("a",): big, ("b",): 3}
    assert engine.snapshot(url, 29) == core_counter(shard.snapshot(29)) == want      # 2**63 on the way
    for as_of in (39, 49):                                                # 2**63, 3 * 2**62
        with engine.read(url, as_of) as value, pytest.raises(engine.corruption, match="overflows int64") as e:
            engine.rows(value)
        assert url in str(e.value)
        with pytest.raises(CorruptionError, match="overflows int64"):    # the pyarrow read refuses it too
            shard.snapshot(as_of)
    advance_since(shard, target=20)                                       # times 0, 10 read as 20
    assert engine.changes(url, 20, 50) == core_counter(shard.changes(20, 50))
    assert engine.changes(url, 20, 50)[("a", 20)] == big
    advance_since(shard, target=40)                                       # 0..30 read as 40: 3 * 2**62
    with engine.read(url, changes=(40, 50)) as value, pytest.raises(engine.corruption, match="overflows int64"):
        engine.rows(value)
    with pytest.raises(CorruptionError, match="overflows int64"):
        shard.changes(40, 50)
    assert not shard.leases()
