"""Maintenance, schema changes and readers as actors: each a chain of passes in simulated time.

Every pass is one actor calling the library's own entry points on a fresh shard handle, then
scheduling its next pass a few simulated minutes later, as a maintenance DAG would:

* compaction: :func:`shardsink.maintenance.compact` (size-tiered merges, one commit each);
* since and retention: :func:`shardsink.maintenance.set_retention` once, then
  :func:`shardsink.maintenance.advance_since` at the simulated now;
* GC: the compaction sweep (:func:`shardsink.maintenance.compact.sweep`) then
  :func:`shardsink.maintenance.gc.collect`, with the plan's grace period on the simulated clock;
* a schema change: :meth:`shardsink.core.shard.Shard.evolve_to` adding the nullable column ``x``;
* a reader: a snapshot at a readable time it picks (``since <= t < upper`` as it read them);
  in the direct world it must equal the model (:meth:`shardsink_dev.sim.sources.TickSource.rows`)
  as of ``t``: the contents as of a readable time, checked while everything else runs.

A pass whose body raised is judged like a task (:func:`shardsink_dev.sim.ctx.judge`): a crash,
an unknown outcome or a storage failure is normal (the next pass goes on), a corruption or an
unexpected error is a violation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from shardsink.errors import ReadFrontierError
from shardsink.maintenance import advance_since, compact, set_retention
from shardsink.maintenance.compact import CompactOptions, sweep
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink_dev.sim.ctx import Sim, judge
from shardsink_dev.sim.sched import Actor

#: The gap between two passes of one maintenance actor (simulated seconds), by tape choice.
GAPS = (40.0, 5.0, 150.0, 700.0)


def passes(sim: Sim, name: str, count: int, body: Callable[[int], Any], *, first: float = 0.0) -> None:
    """``count`` passes of ``body(i)``, the first after ``first`` seconds, each next after a drawn gap."""
    if count <= 0:
        return

    def spawn(i: int, delay: float) -> None:
        def end(a: Actor) -> None:
            judge(sim, a.name, a.error)
            if i + 1 < count:
                spawn(i + 1, sim.tape.pick(GAPS))
        sim.sched.spawn(f"{name}{i}", lambda: body(i), delay=delay, on_end=end)

    spawn(0, first)


def compaction(sim: Sim, i: int) -> Any:
    return compact(sim.shard(), options=CompactOptions(writer="maintenance"))


def since(sim: Sim, i: int) -> Any:
    shard = sim.shard()
    if i == 0:
        set_retention(shard, sim.plan.interval // 2, writer="maintenance")
    return advance_since(shard, writer="maintenance", now=sim.now())


def gc(sim: Sim, i: int) -> Any:
    shard = sim.shard()
    sweep(shard, grace_s=sim.plan.grace_s, now=sim.now())
    return collect(shard, GcOptions(grace_s=sim.plan.grace_s, clock=sim.world.clock.time))


def evolve(sim: Sim, i: int) -> Any:
    shard = sim.shard()
    return shard.evolve_to(pa.schema([*shard.schema, pa.field("x", pa.int64())]), writer="maintenance")


def reader(sim: Sim, expected: Callable[[int], dict[tuple[str, int], int]] | None) -> Callable[[int], Any]:
    """A reader pass: one snapshot at a readable time, checked against ``expected(t)`` if given."""
    def read(i: int) -> Any:
        shard = sim.shard()
        info = shard.info()
        if info.upper is None or info.upper <= info.since:
            return None
        t = info.since + sim.tape.draw(info.upper - info.since)
        try:
            got = shard.snapshot(t)
        except ReadFrontierError:
            return None  # since moved past t meanwhile: the read is refused, never wrong
        if expected is not None:
            check_contents(sim, f"reader{i} snapshot as of {t}", got, expected(t))
        return None
    return read


def check_contents(sim: Sim, what: str, got: pa.Table, want: dict[tuple[str, int], int]) -> None:
    """A snapshot (``k``, ``n``, maybe ``x``, ``_count``) must hold each wanted row once, nothing else."""
    rows = got.to_pylist()
    seen = {(r["k"], r["n"]): r["_count"] for r in rows}
    bad_x = [r for r in rows if r.get("x") not in (None, r["n"])]
    if seen != dict.fromkeys(want, 1) or bad_x:
        extra = sorted(set(seen) - set(want))[:3]
        missing = sorted(set(want) - set(seen))[:3]
        twice = sorted(k for k, c in seen.items() if c != 1)[:3]
        raise sim.violation("contents-differ", f"{what}: missing {missing}, unexpected {extra}, "
                                               f"counts != 1 {twice}, bad x {bad_x[:2]}")
