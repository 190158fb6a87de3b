"""GC steps 1 to 3, the state history below the horizon: anchor the oldest retained version,
delete the condemned versions (stragglers first, then oldest chunk first), then the rollups
below the oldest retained version.

Every step is idempotent and leaves a readable, verifiable shard; versions and rollups
are deleted only through ``AdminHandle.delete_versions`` and ``AdminHandle.delete_rollup``, and
never one younger than the grace period. Dry runs decide and count, writing nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shardsink.core.admin import AdminHandle
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError
from shardsink.maintenance.gc_horizon import Horizon, must_fetch
from shardsink.maintenance.gc_types import StepHook
from shardsink.maintenance.history import Listing, batches_at, removals

log = logging.getLogger("shardsink.maintenance.gc")


@dataclass(frozen=True)
class VersionsCollected:
    """What steps 1 and 2 did (or would do, in a dry run)."""

    versions_deleted: int
    #: The oldest retained version afterwards (the horizon's target in a dry run).
    retained_from: int
    #: Batch lowers known from the versions this run deleted, read before they went (step 4 needs them).
    lowers: dict[str, int]


def collect_versions(shard: Shard, hz: Horizon, listing: Listing, *, cutoff: float, dry: bool, delete_batch: int,
                     hook: StepHook) -> VersionsCollected:
    """Steps 1 and 2: anchor the horizon's oldest version, then delete the versions below it."""
    target, condemned = _anchor(shard, hz, listing, dry=dry, hook=hook)
    versions_deleted, oldest_now = _delete_versions(shard.admin(), hz, listing, target, cutoff=cutoff, dry=dry,
                                                    delete_batch=delete_batch, hook=hook)
    retained_from = target if dry else oldest_now
    return VersionsCollected(versions_deleted, retained_from, condemned)


def _anchor(shard: Shard, hz: Horizon, listing: Listing, *, dry: bool, hook: StepHook) -> tuple[int, dict[str, int]]:
    """Step 1: the version to anchor (the horizon's oldest, or the oldest present if its chain
    is unreadable) and the lowers of the batches removed below it; anchors it unless dry."""
    admin = shard.admin()
    target = hz.oldest
    condemned: dict[str, int] = {}
    if target > hz.oldest_present:
        try:
            batches = batches_at(admin, target, listing)
        except CorruptionError as e:
            # e.g. an interrupted run anchored a newer version and the bounds moved back:
            # its chain is gone, so keep every version this time (nothing is lost).
            log.warning("gc %s: cannot anchor version %d (%s); no versions deleted", shard.url, target, e)
            target = hz.oldest_present
        if target > hz.oldest_present:
            # The lowers of batches removed below the new oldest version, read before their
            # versions go (step 4's fate checks need them): from the removal chain (one
            # version per compaction), else from every condemned version.
            chain = removals(admin, must_fetch(admin, hz.head), above=target, down_to=hz.oldest_present - 1)
            condemned = chain.lowers if chain is not None else _lowers_below(admin, hz.oldest_present, target,
                                                                             listing)
        if not dry and target > hz.oldest_present:
            admin.anchor(target, batches)
            hook("anchored")
    return target, condemned


def _delete_versions(admin: AdminHandle, hz: Horizon, listing: Listing, target: int, *, cutoff: float, dry: bool,
                     delete_batch: int, hook: StepHook) -> tuple[int, int]:
    """Step 2: delete the stragglers, then the versions below ``target``; returns how many
    versions went (or would go) and the oldest version left."""
    versions_deleted = 0
    oldest_now = hz.oldest_present
    # Stragglers of an interrupted run first, then the condemned range, oldest chunk first.
    doomed: list[int] = list(hz.stragglers)
    for s in range(hz.oldest_present, target):
        if listing.versions[s].modified > cutoff:  # never younger than grace (cannot happen by the bound)
            break
        doomed.append(s)
    for i in range(0, len(doomed), delete_batch):
        chunk = doomed[i:i + delete_batch]
        if not dry:
            admin.delete_versions(chunk)
            hook("version")
        versions_deleted += len(chunk)
        oldest_now = max(oldest_now, chunk[-1] + 1)
    if doomed and not dry:
        hook("versions")
    return versions_deleted, oldest_now


def collect_rollups(admin: AdminHandle, listing: Listing, retained_from: int, *, cutoff: float, dry: bool) -> int:
    """Step 3: delete the rollups below the oldest retained version; returns how many."""
    # Rollups below the oldest retained version are garbage once it needs none of them:
    # it is anchored (carries a rollup at itself) or is version 0.
    rollups_deleted = 0
    if retained_from == 0 or dry or _anchored(admin, retained_from):
        for r, o in sorted(listing.rollups.items()):
            if r < retained_from and o.modified <= cutoff:
                if not dry:
                    admin.delete_rollup(r)
                rollups_deleted += 1
    return rollups_deleted


def _anchored(admin: AdminHandle, seqno: int) -> bool:
    v = admin.fetch(seqno)
    return v is not None and v.header.rollup == seqno


def _lowers_below(admin: AdminHandle, lo: int, hi: int, listing: Listing) -> dict[str, int]:
    """The lowers of the batches versions ``lo .. hi-1`` knew, read before they are deleted, so
    that step 4 need not read parts to learn the lower of a batch compacted away in them."""
    out: dict[str, int] = {}
    try:
        for b in batches_at(admin, lo, listing):
            out.setdefault(b.desc_id, b.lower)
    except CorruptionError:
        pass  # an interrupted run left lo without its chain: its added batches still help
    for v in admin.fetch_many(range(lo + 1, hi)):
        for b in v.added:
            out.setdefault(b.desc_id, b.lower)
    return out
