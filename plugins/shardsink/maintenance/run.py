"""One maintenance pass over one shard: advance since, compact, GC, verify.

::

    summary = maintain(shard, MaintenanceOptions(gc=GcOptions(grace_s=3600)))

Compaction and since advancement live in :mod:`shardsink.maintenance.compact` and
:mod:`shardsink.maintenance.since`. This module only needs, if present:

* ``shardsink.maintenance.since.advance_since(shard)``,
* ``shardsink.maintenance.compact.compact(shard)`` and
* ``shardsink.maintenance.compact.sweep(shard)`` (leftovers of crashed compactions,
  whose fate depends on their inputs; GC leaves descriptions with a compaction
  manifest to it),

each called with the shard alone, committing through ``Machine.commit`` and returning
anything (its ``str`` is logged and put in the summary). A missing module or function
is skipped with a log line, so this pass works with or without them.

Order: since first (retention and leases; merges then consolidate at the new since),
then compaction (it replaces batches; the replaced parts become garbage once the
versions referencing them leave retention) and its sweep, then GC (deletes what the
retained history no longer references), then verify (proves the shard is still whole:
a problem fails the pass).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from shardsink.core.shard import Shard
from shardsink.maintenance.gc import GcOptions, GcReport, collect
from shardsink.maintenance.verify import VerifyReport, verify

log = logging.getLogger("shardsink.maintenance")


@dataclass(frozen=True, kw_only=True)
class MaintenanceOptions:
    compact: bool = True
    advance_since: bool = True
    gc: GcOptions | None = field(default_factory=GcOptions)  # None: no GC
    verify: bool = True


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


@dataclass(frozen=True)
class MaintenanceSummary:
    url: str
    before: Footprint
    after: Footprint
    steps: dict[str, str]
    gc: GcReport | None
    verify: VerifyReport | None

    @property
    def ok(self) -> bool:
        return self.verify is None or self.verify.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "ok": self.ok, "before": asdict(self.before), "after": asdict(self.after),
            "steps": dict(self.steps), "objects_deleted": self.gc.objects_deleted if self.gc else 0,
            "gc": self.gc.to_dict() if self.gc else None,
            "problems": [asdict(p) for p in self.verify.problems] if self.verify else [],
            "leaks": len(self.verify.leaks) if self.verify else 0,
        }


def footprint(shard: Shard) -> Footprint:
    """The shard's stats and a count of its stored objects (one LIST of the whole shard)."""
    info = shard.info()
    objs = list(shard.blob.list(""))
    return Footprint(info.seqno, info.since, info.upper, info.stats.batches, info.stats.parts, info.stats.bytes,
                     len(objs), sum(o.size for o in objs))


def _optional(module: str, name: str) -> Callable[[Shard], Any] | None:
    try:
        mod = importlib.import_module(f"shardsink.maintenance.{module}")
    except ImportError:
        return None
    fn = getattr(mod, name, None)
    return fn if callable(fn) else None


def maintain(shard: Shard, options: MaintenanceOptions | None = None) -> MaintenanceSummary:
    """Run the pass (module docstring) and return its summary; errors of a step propagate."""
    opts = options or MaintenanceOptions()
    before = footprint(shard)
    steps: dict[str, str] = {}
    for step, module, name, enabled in (("since", "since", "advance_since", opts.advance_since),
                                        ("compact", "compact", "compact", opts.compact),
                                        ("sweep", "compact", "sweep", opts.compact)):
        if not enabled:
            steps[step] = "disabled"
            continue
        fn = _optional(module, name)
        if fn is None:
            steps[step] = f"skipped: shardsink.maintenance.{module}.{name} is not available"
            log.info("maintenance %s: %s", shard.url, steps[step])
            continue
        result = fn(shard)
        steps[step] = f"done: {result}"
        log.info("maintenance %s: %s %s", shard.url, step, result)
    report = collect(shard, opts.gc) if opts.gc is not None else None
    steps["gc"] = "done" if report is not None else "disabled"
    checked = verify(shard) if opts.verify else None
    steps["verify"] = ("ok" if checked.ok else f"{len(checked.problems)} problems") if checked else "disabled"
    after = footprint(shard)
    summary = MaintenanceSummary(shard.url, before, after, steps, report, checked)
    log.info("maintenance %s: batches %d -> %d, parts %d -> %d, bytes %d -> %d, objects %d -> %d (%d deleted); "
             "verify %s", shard.url, before.batches, after.batches, before.parts, after.parts, before.bytes,
             after.bytes, before.objects, after.objects, report.objects_deleted if report else 0, steps["verify"])
    if checked is not None:
        for p in checked.problems:
            log.error("maintenance %s: verify problem %s: %s", shard.url, p.object, p.message)
    return summary
