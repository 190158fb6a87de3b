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
  as of ``t``: the contents as of a readable time, checked while everything else runs;
* a leased reader, half the reader passes: the lease at ``t`` and its pinned version
  (:func:`shardsink.core.leases.acquire_pinned` on the simulated clock, the plan on the pinned
  version, :func:`shardsink.core.plan.plan_pinned`), then, as a job that reads for minutes, a
  second actor of the same process some simulated minutes later renews the lease
  (:func:`~shardsink.core.leases.renew`), reads the plan's parts (compaction, since and GC may
  have run meanwhile: the lease holds them back) and releases it. A crash leaves the lease to
  expire in simulated time, and GC to delete it.

A pass whose body raised is judged like a task (:func:`shardsink_dev.sim.ctx.judge`): a crash,
an unknown outcome or a storage failure is normal (the next pass goes on), a corruption or an
unexpected error is a violation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from shardsink.core import leases
from shardsink.core import plan as pl
from shardsink.errors import ReadFrontierError
from shardsink.maintenance import advance_since, compact, set_retention
from shardsink.maintenance.compact import CompactOptions, sweep
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink_dev.sim.ctx import Sim, judge
from shardsink_dev.sim.sched import Actor

#: A leased reader's lease (seconds) and how long after taking it the reading actor runs.
LEASE_TTL_S, READ_AFTER = 600.0, (30.0, 200.0, 400.0)
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
            if sim.tape.chance(500):
                return _leased(sim, shard, t, expected, f"reader{i}")
            got = shard.snapshot(t)
        except ReadFrontierError:
            return None  # since moved past t meanwhile: the read is refused, never wrong
        if expected is not None:
            check_contents(sim, f"reader{i} snapshot as of {t}", got, expected(t))
        return None
    return read


def _leased(sim: Sim, shard: Any, t: int, expected: Callable[[int], dict[tuple[str, int], int]] | None,
            who: str) -> None:
    """A leased read at ``t``: lease and plan now, the parts read by a later actor of this process."""
    head = shard.reader().head()
    bounds = pl.Bounds.resolve(shard.url, head.header, as_of=t)
    target = pl.reader_schema(head.header, "current", bounds, url=shard.url)
    lease, version = leases.acquire_pinned(shard, bounds.lease_at, holder=f"sim-{who}", ttl_s=LEASE_TTL_S,
                                           clock=sim.world.clock.time, head=head)
    plan = pl.plan_pinned(shard, pl.Pinned(shard.url, bounds, target, version))
    process = sim.sched.current.process if sim.sched.current is not None else {}

    def finish() -> None:
        reading = sim.shard()
        leases.renew(reading, lease, ttl_s=LEASE_TTL_S, clock=sim.world.clock.time)
        data = reading.reader().read_plan(plan).to_pylist()
        leases.release(reading, lease)
        if expected is not None:
            counts: dict[tuple[str, int], int] = {}
            for r in data:
                counts[(r["k"], r["n"])] = counts.get((r["k"], r["n"]), 0) + r["_diff"]
            got = pa.Table.from_pylist([{"k": k, "n": n, "_count": c} for (k, n), c in counts.items() if c])
            check_contents(sim, f"{who} leased read as of {t}", got, expected(t))

    def end(a: Actor) -> None:
        judge(sim, a.name, a.error)

    a = sim.sched.spawn(f"{who}-read", finish, delay=sim.tape.pick(READ_AFTER), on_end=end)
    a.process = process  # the same process, minutes later


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
