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
from read_helpers import NAN_KEY, SCHEMA, Model, as_counter, core_counter, decanonicalise, write_history

from shardsink import Shard
from shardsink.maintenance.compact import compact_batches
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.since import advance_since
from shardsink.read import LeasedRead


@dataclass(frozen=True)
class Engine:
    """``read(url, as_of, changes)``: the engine reader; ``rows(engine object)``: its result
    rows as tuples in the plan's column order."""

    read: Callable[..., LeasedRead[Any]]
    rows: Callable[[Any], Sequence[tuple[Any, ...]]]

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
    assert all(shard.blob.get(k) is not None for k in pinned), "GC deleted a part under a live reader"
    assert as_counter(engine.rows(reader.value)) == model.snapshot(39)  # still materialises
    reader.close()
    assert not shard.leases()
    collect(shard, GcOptions(grace_s=0, retention=1))
    assert all(shard.blob.get(k) is None for k in pinned)          # without the lease GC takes them


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
