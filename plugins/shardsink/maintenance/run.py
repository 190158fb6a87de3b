"""One maintenance pass over one shard: advance since, compact, sweep, GC, verify.

::

    summary = maintain(shard, MaintenanceOptions(gc=GcOptions(grace_s=3600)))
    done = compaction_pass(shard)      # since, compaction, sweep, rollup only (no GC)

Order: since first (retention and leases; merges then consolidate at the new since),
then compaction (it replaces batches; the replaced parts become garbage once the
versions referencing them leave retention) and the sweep of crashed compactions'
leftovers (whose fate depends on their inputs; GC leaves descriptions with a compaction
manifest to it), then GC (deletes what the retained history no longer references),
then verify (proves the shard is still whole: a problem fails the pass).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shardsink.core import checks as ck
from shardsink.core.shard import Shard
from shardsink.maintenance.compact import CompactionResult, CompactOptions, Swept, compact, sweep
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions, GcReport
from shardsink.maintenance.since import SinceResult, advance_since
from shardsink.maintenance.verify import VerifyReport, verify

log = logging.getLogger("shardsink.maintenance")


@dataclass(frozen=True, kw_only=True)
class MaintenanceOptions:
    compact: bool = True
    advance_since: bool = True
    compact_options: CompactOptions = field(default_factory=CompactOptions)
    #: leftovers of crashed compactions younger than this are left to a later pass
    sweep_grace_s: float = 3600.0
    gc: GcOptions | None = field(default_factory=GcOptions)  # None: no GC
    verify: bool = True

    def __post_init__(self) -> None:
        ck.check_seconds(self.sweep_grace_s, what="sweep grace")


@dataclass(frozen=True)
class Maintained:
    """What :func:`compaction_pass` did (None: the step was disabled)."""

    since: SinceResult | None
    compaction: CompactionResult | None
    swept: tuple[Swept, ...]


def compaction_pass(shard: Shard, options: MaintenanceOptions | None = None, *,
                    now: float | None = None, writer: str | None = None) -> Maintained:
    """Advance since, then compact (so merges consolidate at the new since), then sweep
    leftovers of crashed compactions, then (if anything merged) write a rollup of the
    compacted batch list. No GC, no verify: see :func:`maintain`. ``writer`` names the
    commits (e.g. ``airflow:<dag_id>/<run_id>``; ``compact_options.writer`` wins for compactions;
    default: host:pid)."""
    opts = options or MaintenanceOptions()
    copts = opts.compact_options
    if writer is not None and copts.writer is None:
        copts = replace(copts, writer=writer)
    s = advance_since(shard, now=now, writer=writer) if opts.advance_since else None
    c = compact(shard, options=copts) if opts.compact else None
    swept = tuple(sweep(shard, grace_s=opts.sweep_grace_s, now=now)) if opts.compact else ()
    if c is not None and c.applied:
        shard.admin().rollup_now()  # readers get the compacted batch list without replaying diffs
    return Maintained(s, c, swept)


@dataclass(frozen=True)
class Footprint:
    """What a shard holds: live batches/parts/bytes (state stats) and stored objects."""

    seqno: int
    since: int
    upper: int | None
    batches: int
    parts: int
    bytes: int
    objects: int
    object_bytes: int
    rows: int = 0  # update rows of the live batches (state stats)


@dataclass(frozen=True)
class MaintenanceSummary:
    url: str
    before: Footprint
    after: Footprint
    steps: dict[str, str]
    gc: GcReport | None
    verify: VerifyReport | None
    #: what since, compaction and the sweep did (None: an older caller built the summary)
    compaction_pass: Maintained | None = None

    @property
    def ok(self) -> bool:
        return self.verify is None or self.verify.ok

    def render(self) -> str:
        """The steps for operators, one line: ``since: 0 → 0; compact: 3 batches → 1, …; sweep: 0 settled;
        gc: deleted 2 objects (…); verify: ok`` (never a repr)."""
        steps = {k: v.removeprefix("done: ") for k, v in self.steps.items()}
        if self.gc is not None:
            steps["gc"] = self.gc.render()
        return "; ".join(f"{k}: {v}" for k, v in steps.items())

    def to_dict(self) -> dict[str, Any]:
        """Structured data (XCom, JSON): every step's result as values, ``steps`` as rendered text."""
        m = self.compaction_pass
        return {
            "url": self.url, "ok": self.ok, "before": asdict(self.before), "after": asdict(self.after),
            "steps": dict(self.steps), "objects_deleted": self.gc.objects_deleted if self.gc else 0,
            "since": asdict(m.since) if m and m.since else None,
            "compaction": asdict(m.compaction) if m and m.compaction else None,
            "swept": [asdict(x) for x in m.swept] if m else [],
            "gc": self.gc.to_dict() if self.gc else None,
            "problems": [asdict(p) for p in self.verify.problems] if self.verify else [],
            "leaks": len(self.verify.leaks) if self.verify else 0,
        }


def footprint(shard: Shard) -> Footprint:
    """The shard's stats and a count of its stored objects (one LIST of the whole shard)."""
    info = shard.info()
    objs = shard.admin().list_objects()
    return Footprint(info.seqno, info.since, info.upper, info.stats.batches, info.stats.parts, info.stats.bytes,
                     len(objs), sum(o.size for o in objs), info.stats.rows)


def maintain(shard: Shard, options: MaintenanceOptions | None = None, *,
             writer: str | None = None) -> MaintenanceSummary:
    """Run the pass (module docstring) and return its summary; errors of a step propagate.
    ``writer``: the name its commits carry (see :func:`compaction_pass`)."""
    opts = options or MaintenanceOptions()
    before = footprint(shard)
    m = compaction_pass(shard, opts, writer=writer)
    steps: dict[str, str] = {
        "since": f"done: {m.since.render()}" if m.since is not None else "disabled",
        "compact": f"done: {m.compaction.render()}" if m.compaction is not None else "disabled",
        "sweep": f"done: {len(m.swept)} settled" if opts.compact else "disabled",
    }
    for step in ("since", "compact", "sweep"):
        log.info("maintenance %s: %s %s", shard.url, step, steps[step])
    report = collect(shard, opts.gc) if opts.gc is not None else None
    steps["gc"] = "done" if report is not None else "disabled"
    checked = verify(shard) if opts.verify else None
    steps["verify"] = ("ok" if checked.ok else f"{len(checked.problems)} problems") if checked else "disabled"
    after = footprint(shard)
    summary = MaintenanceSummary(shard.url, before, after, steps, report, checked, m)
    log.info("maintenance %s: batches %d -> %d, parts %d -> %d, bytes %d -> %d, objects %d -> %d (%d deleted); "
             "verify %s", shard.url, before.batches, after.batches, before.parts, after.parts, before.bytes,
             after.bytes, before.objects, after.objects, report.objects_deleted if report else 0, steps["verify"])
    if checked is not None:
        for p in checked.problems:
            log.error("maintenance %s: verify problem %s: %s", shard.url, p.object, p.message)
    return summary
