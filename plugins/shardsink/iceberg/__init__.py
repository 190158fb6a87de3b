"""Iceberg views of shards: any Iceberg engine reads a shard, as of any retained version, with no copy.

::

    from shardsink import iceberg
    iceberg.enable(shard)                 # the shard option, then the first snapshot
    iceberg.current_location(shard)       # .../iceberg/metadata/v<seqno>.metadata.json
    iceberg.sync(shard)                   # catch up from any state (idempotent)
    iceberg.flush(timeout=30)             # wait for the upkeep queued by this process's commits


A capability on top of core: its objects live under the shard's ``iceberg/`` root folder
(registered with core, so GC and verify know them), it is turned on by the shard option
``iceberg=on`` (recorded in the shard's state), and it is kept current by core's after-commit
hook (:mod:`shardsink.core.after_commit`) in whichever process commits: by default on one
background worker per process (:mod:`shardsink.iceberg.background`), so the commit returns without
waiting; :func:`flush` waits for it (run at exit, and by core's ``drain`` where a task or command
ends), and ``UPKEEP.using(mode="inline")`` runs it in the committing call. See
docs/architecture.md ("The Iceberg view") for the mapping.
"""

from __future__ import annotations

from shardsink.core.after_commit import (
    register_after_commit,
    register_drain,
    register_part_holder,
    register_view_check,
    register_view_collector,
)
from shardsink.core.roots import register_root
from shardsink.iceberg import layout
from shardsink.iceberg.background import Mode, Upkeeper
from shardsink.iceberg.check import check
from shardsink.iceberg.keeper import (
    current_location,
    enable,
    find,
    forget,
    garbage,
    held,
    snapshot_as_of,
    sync,
    upkeep,
)

ROOT = register_root(f"{layout.TABLE}/", owner="shardsink.iceberg", prefix=True)
#: The process's upkeep worker: ``UPKEEP.using(mode="inline")`` for a block that must see the view
#: right after each commit (the simulator, tests); ``UPKEEP.set_mode(...)`` for the process.
UPKEEP = Upkeeper(upkeep)


def flush(timeout: float | None = None) -> bool:
    """Wait until the Iceberg upkeep queued by this process's commits is done (at most ``timeout``
    seconds; None: no limit); False when it timed out (the view is behind, never wrong, until the
    next commit or sync). Never raises."""
    return UPKEEP.flush(timeout)


register_after_commit(layout.OPTION, UPKEEP.submit)
register_drain(layout.OPTION, flush)
register_part_holder(layout.OPTION, held)  # GC keeps what a retained snapshot references
register_view_check(layout.OPTION, check)  # verify checks the view
register_view_collector(layout.OPTION, garbage)  # GC deletes what the view no longer needs

__all__ = ["UPKEEP", "Mode", "Upkeeper", "current_location", "enable", "find", "flush", "forget", "snapshot_as_of",
           "sync"]
