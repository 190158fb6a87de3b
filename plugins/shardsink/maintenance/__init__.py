"""Maintenance of long-lived shards: compaction, since/retention, GC and verify.

::

    from shardsink.maintenance import advance_since, compact, maintain, set_retention
    set_retention(shard, "7d")          # a committed state transition
    advance_since(shard)                # since = min(upper - retention, leased as_of)
    compact(shard)                      # size-tiered merges, one commit each
    compaction_pass(shard)              # both, in that order, plus the leftovers sweep
    maintain(shard)                     # the whole pass: the above, then GC and verify

Everything here is a client of core: the transitions are pure functions in
``core/transitions.py`` committed through the maintenance handle (``shard.admin()``,
:mod:`shardsink.core.admin`: ``AdminHandle.commit``); deletions of staged data go through
``AdminHandle.delete_staged`` (``core.fate``'s one deleter). Nothing here touches the commit
machine, the blob or a raw key.
"""

from __future__ import annotations

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
from shardsink.maintenance.run import Maintained, MaintenanceOptions, MaintenanceSummary, compaction_pass, maintain
from shardsink.maintenance.schedule import ScheduleOptions, schedule_merges
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
    "MaintenanceOptions",
    "MaintenanceSummary",
    "Merge",
    "MergeOptions",
    "ScheduleOptions",
    "SinceResult",
    "Swept",
    "advance_since",
    "compact",
    "compact_batches",
    "compaction_pass",
    "format_duration",
    "maintain",
    "merge_parts",
    "parse_duration",
    "retention_of",
    "schedule_merges",
    "set_retention",
    "sweep",
]
