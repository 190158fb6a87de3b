"""Maintenance of long-lived shards: compaction, since/retention (GC lives beside them).

::

    from shardsink.maintenance import advance_since, compact, maintain, set_retention
    set_retention(shard, "7d")          # a committed state transition
    advance_since(shard)                # since = min(upper - retention, leased as_of)
    compact(shard)                      # size-tiered merges, one commit each
    maintain(shard)                     # both, in that order, plus the leftovers sweep

Everything here is a client of core: the transitions are pure functions in
``core/state.py`` committed by ``Machine.commit``; deletions go through
``core.fate.delete_staged``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsink.core.shard import Shard
from shardsink.maintenance.compact import (
    CompactionResult,
    CompactOptions,
    Hooks,
    Merge,
    Swept,
    compact,
    compact_batches,
    sweep,
)
from shardsink.maintenance.merge import MergeOptions, merge_parts
from shardsink.maintenance.plan import PlanOptions, plan_merges
from shardsink.maintenance.since import (
    SinceResult,
    advance_since,
    format_duration,
    parse_duration,
    retention_of,
    set_retention,
)

__all__ = [
    "CompactOptions",
    "CompactionResult",
    "Hooks",
    "Maintained",
    "Merge",
    "MergeOptions",
    "PlanOptions",
    "SinceResult",
    "Swept",
    "advance_since",
    "compact",
    "compact_batches",
    "format_duration",
    "maintain",
    "merge_parts",
    "parse_duration",
    "plan_merges",
    "retention_of",
    "set_retention",
    "sweep",
]


@dataclass(frozen=True)
class Maintained:
    since: SinceResult
    compaction: CompactionResult
    swept: tuple[Swept, ...]


def maintain(shard: Shard, *, options: CompactOptions | None = None, sweep_grace_s: float = 3600.0,
             now: float | None = None) -> Maintained:
    """One maintenance pass: advance since, then compact (so merges consolidate at the new
    since), then sweep leftovers of crashed compactions older than ``sweep_grace_s``, then
    (if anything merged) write a rollup of the compacted batch list."""
    s = advance_since(shard, now=now)
    c = compact(shard, options=options or CompactOptions())
    swept = tuple(sweep(shard, grace_s=sweep_grace_s, now=now))
    if c.applied:
        shard.machine.rollup_now()  # readers get the compacted batch list without replaying diffs
    return Maintained(s, c, swept)
