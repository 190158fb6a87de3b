"""The end-of-schedule checks, once every actor ended (the store then answers every request at once).

1. **exactly once**: every acknowledged description is committed (the checker saw its version),
   every committed one was minted by a run, and (checked as it happened) none twice; ambiguous
   ones (attempted, never acknowledged) are committed at most once.
2. **contents**: the model's rows as of every readable time: the change feed ``[since, upper)``
   holds each row of the model once (times below ``since`` read as ``since``), which fixes the
   contents as of every ``t >= since``; the snapshot at ``upper - 1`` is checked on its own path
   (readers check others while the schedule runs): the one verify reads in check 3, through the same
   :meth:`~shardsink.core.shard.Shard.snapshot`, kept for this check (:class:`Recording`); and the
   parts the head references, read straight from the store with pyarrow (not through the library),
   sum to the same rows (a part's bytes parsed once per process: :func:`_part_rows`).
3. **GC and verify**: past the grace period (and the expiry of any lease a crashed reader left),
   the compaction sweep and GC run clean, then
   :func:`shardsink.maintenance.verify.verify` finds no problem (``shardsink verify`` exits 0) and
   no leaked object (GC left none). A crashed compaction's output stays while its inputs are all
   live (it may still apply) and verify lists it once older than the grace period: the next
   maintenance pass's compaction replaces an input and its sweep takes it, so a leak of a
   compaction is checked again after such a pass (:func:`shardsink.maintenance.run.compaction_pass`,
   as :func:`shardsink.maintenance.run.maintain` runs it, with the simulated clock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core.leases import CLOCK_SKEW_S
from shardsink.core.read import SchemaChoice
from shardsink.core.shard import Shard
from shardsink.maintenance.compact import sweep
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.run import MaintenanceOptions, compaction_pass
from shardsink.maintenance.verify import verify
from shardsink_dev.sim.check import CLOSED
from shardsink_dev.sim.ctx import SHARD_BUCKET, SHARD_URL, Sim
from shardsink_dev.sim.maint import LEASE_TTL_S, check_contents

#: The model's contents as of a time: (k, n) -> event time.
Model = Callable[[int], dict[tuple[str, int], int]]


def exactly_once(sim: Sim) -> None:
    """Check 1 (module docstring)."""
    led, ck = sim.ledger, sim.checker
    lost = sorted(d for d in led.acked if d not in ck.committed)
    if lost:
        raise sim.violation("acked-not-committed", f"acknowledged but not in the shard: {lost[:3]}")
    phantom = sorted(d for d in ck.committed if d not in led.minted and d not in ck.compactions
                     and not d.startswith("compact-"))
    if phantom:
        raise sim.violation("phantom-commit", f"committed but never minted: {phantom[:3]}")


def contents(sim: Sim, model: Model) -> Callable[[Shard], None]:
    """Check 2 (module docstring): the change feed and the head's parts now; returns the check of
    the snapshot at ``upper - 1``, made on the shard :func:`gc_and_verify` verifies (verify reads
    that very snapshot, through the same :meth:`Shard.snapshot`: one read serves both)."""
    shard = sim.shard()
    info = shard.info()
    upper = CLOSED if info.upper is None else info.upper
    if upper == CLOSED or upper <= info.since:
        return lambda _: None
    feed = shard.changes(info.since, upper).to_pylist()
    got = Counter((r["k"], r["n"], r["_time"]) for r in feed for _ in range(r["_diff"]))
    want = Counter((k, n, max(t, info.since)) for (k, n), t in model(upper - 1).items())
    if got != want or any(r["_diff"] < 0 for r in feed):
        raise sim.violation("contents-differ", f"change feed [{info.since}, {upper}): missing "
                                               f"{sorted((want - got).elements())[:3]}, unexpected "
                                               f"{sorted((got - want).elements())[:3]}")
    raw = _raw_rows(sim)
    if raw != Counter({(k, n): 1 for (k, n) in model(upper - 1)}):
        raise sim.violation("parts-differ", f"the head's parts read directly: {sorted(raw.items())[:4]} ...")

    def snapshot(verified: Shard) -> None:
        seen = verified.snapshots if isinstance(verified, Recording) else {}
        table = seen[upper - 1] if upper - 1 in seen else verified.snapshot(upper - 1)
        check_contents(sim, f"snapshot as of {upper - 1}", table, model(upper - 1))
    return snapshot


class Recording(Shard):
    """A shard handle that keeps the snapshots of the current schema read through it, by time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snapshots: dict[int, pa.Table] = {}

    def snapshot(self, as_of: int | None = None, *, schema: SchemaChoice = "current") -> pa.Table:
        table = super().snapshot(as_of, schema=schema)
        if as_of is not None and schema == "current":
            self.snapshots[as_of] = table
        return table


def _raw_rows(sim: Sim) -> Counter[tuple[str, int]]:
    """The rows the live batches' parts hold, summed, read with pyarrow from the store's bytes."""
    objs = sim.world.objects(SHARD_BUCKET)
    prefix = sim.checker.prefix
    out: Counter[tuple[str, int]] = Counter()
    for keys in sim.checker.live.values():
        for key in keys:
            o = objs.get(f"{prefix}/{key}")
            if o is None:
                raise sim.violation("referenced-part-missing", key)
            for k, n, d in _part_rows(o.data, o.etag):
                out[k, n] = out.get((k, n), 0) + d  # Counter's += without its __missing__ call
    return Counter({r: c for r, c in out.items() if c != 0})


#: The rows of the parts :func:`_part_rows` read, by ETag (the MD5 of the bytes) and size: the
#: schedules' parts often hold the same bytes (the same ticks written the same way).
_ROWS: dict[tuple[str, int], list[tuple[str, int, int]]] = {}


def _part_rows(data: bytes, etag: str) -> list[tuple[str, int, int]]:
    """``(k, n, _diff)`` of each row of a part's bytes; bytes read before are not parsed again."""
    memo = (etag, len(data))
    rows = _ROWS.get(memo)
    if rows is None:
        # the file's own reader (no dataset layer), in this thread (a tiny part: no hand-off to a pool)
        t = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        diffs = t["_diff"].to_pylist() if "_diff" in t.column_names else [1] * t.num_rows
        rows = list(zip(t["k"].to_pylist(), t["n"].to_pylist(), diffs, strict=True))
        if len(_ROWS) >= 4096:
            _ROWS.clear()
        _ROWS[memo] = rows
    return rows


def gc_and_verify(sim: Sim, snapshot: Callable[[Shard], None] | None = None) -> None:
    """Check 3 (module docstring); ``snapshot``: a check of the shard's snapshot, made after the
    first verify (:func:`contents`' check, on the snapshot verify read)."""
    # a fresh handle, as sim.shard() opens it, that keeps the snapshots verify reads
    shard = Recording(SHARD_URL, sleep=sim.world.clock.advance, clock=sim.world.clock.time)
    grace = sim.plan.grace_s
    # past every grace period, and past the expiry of a lease a crashed reader left (by the grace too)
    sim.world.clock.advance(grace + LEASE_TTL_S + CLOCK_SKEW_S + 5.0)
    sweep(shard, grace_s=grace, now=sim.now())
    gc = GcOptions(grace_s=grace, clock=sim.world.clock.time)
    collect(shard, gc)
    rep = verify(shard, now=sim.now(), grace_s=grace)
    if snapshot is not None:
        snapshot(shard)
    if rep.leaks and all(shard.admin().is_compaction(x.object.split("/")[1]) for x in rep.leaks if "/" in x.object):
        compaction_pass(shard, MaintenanceOptions(sweep_grace_s=grace, gc=gc), now=sim.now(), writer="final")
        sim.world.clock.advance(grace + 5.0)
        collect(shard, gc)
        rep = verify(shard, now=sim.now(), grace_s=grace)
    if rep.problems:
        raise sim.violation("verify-problems", "; ".join(f"{p.object}: {p.message}" for p in rep.problems[:3]))
    if rep.leaks:
        raise sim.violation("gc-left-leaks", ", ".join(f"{x.object} ({x.kind})" for x in rep.leaks[:3]))
