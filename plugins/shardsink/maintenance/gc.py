"""Garbage collection: delete state history outside retention and objects nothing can need.

::

    report = collect(shard, GcOptions(grace_s=3600))        # or dry_run=True
    report.objects                                          # a dry run: every object's class, as of its clock

**What is retained.** The state versions ``[oldest, head]`` with ``oldest`` the minimum of

* ``retention``: the first version whose upper is past ``upper − retention`` (closed
  shard: its last finite upper), so ``shardsink log`` shows every commit that sealed a time
  inside the time-travel window; ``retention = None`` (the default) keeps all history;
* ``leases``: for every live lease, the rollup base of version ``lease.seqno`` (the
  reader reads a version ``>= lease.seqno``, whose batch list is its rollup plus the
  diffs after it; rollup pointers never decrease with seqno);
* ``grace``: the rollup base of ``G``, the version that was the head ``grace`` ago (the
  newest version created before ``now − grace``): any reader or writer that read the
  head within the grace period still finds its version's whole chain, and a writer that
  read version ``n`` can never re-create a deleted ``n+1`` (a fork) unless it sleeps
  longer than the grace period between its read and its conditional put;
* ``idempotency``: the oldest seqno in ``G``'s idempotency window (``header.recent``),
  so :mod:`shardsink.core.fate` can always fetch the version that committed a recent
  description;
* ``hint``: the seqno of ``state/LATEST.json`` (readers probe forward from it);

then moved back, if needed, to the rollup the next version builds on, so that every
retained version's batch list is readable from its own rollup pointer (not only the
oldest one's, which step 1 anchors).

**Order (crash safety: every step is idempotent and leaves a readable, verifiable
shard; the next run finishes the job).**

1. *anchor*: write the rollup at ``oldest`` and point version ``oldest`` at it
   (``AdminHandle.anchor``), so it needs nothing older;
2. delete versions below ``oldest``, oldest chunk first, 1,000 per multi-object delete
   (``GcOptions.delete_batch``). Inside one such request S3 deletes in no particular
   order, so a failure may leave condemned versions below a gap: the anchored
   ``oldest`` starts the chain (:func:`~shardsink.maintenance.history.retained_start`),
   verify lists the stragglers as leaks, and the next run deletes them first;
3. delete rollups below ``oldest``;
4. parts and manifests: list ``parts/`` and ``staging/`` FIRST, then read the head and
   compute what the retained versions reference (:func:`~shardsink.maintenance.history.protected`:
   the batches at ``oldest`` and at the head plus those the removal chain names, one
   version read per compaction; every retained version only for shards written before
   the chain existed). Every listed object that is
   unreferenced and older than the grace period goes to
   :func:`shardsink.core.fate.delete_staged_many` with its description (``only=`` exactly
   the vetted keys; 500 descriptions per call, one head read and one multi-object
   delete): a description that may still commit is refused there, a committed one
   keeps its batch. The description's lower comes from a retained batch, else the
   removal chain read before step 2 (or the condemned versions), else its manifest,
   else the smallest ``_time`` of its parts (in ``[lower, upper)``: a proxy for the
   lower that finds the same crossing version);
5. lease objects expired for longer than the grace period;
6. reclock bound inputs (``plans/``, caches a writer rebuilds) older than the grace period, and
   the landing zone's file plans (``landing/plans/``) older than it whose description's fate is
   final (one head read for all of them: a plan is its description's input, kept while it may commit).

HAZARD (clocks): object ages compare the store's modification times with this host's
clock. Keep clock skew far below the grace period.

HAZARD (compaction): a compaction's output parts are decided like a description's. A
compactor must commit its output within the grace period of writing it, or abandon it.

The steps live in their own modules: the horizon in :mod:`~shardsink.maintenance.gc_horizon`,
steps 1 to 3 in :mod:`~shardsink.maintenance.gc_versions`, step 4 in
:mod:`~shardsink.maintenance.gc_parts` (with :mod:`~shardsink.maintenance.gc_staged`), the
options and report in :mod:`~shardsink.maintenance.gc_types`; this module runs them in order.
"""

from __future__ import annotations

import logging

import msgspec

import shardsink.reclock.layout  # noqa: F401  (registers reclock's expiring bound inputs)
from shardsink.core import leases as ls
from shardsink.core.fate import CannotCommit, Committed
from shardsink.core.shard import Shard
from shardsink.maintenance.census_read import take_census
from shardsink.maintenance.gc_horizon import horizon
from shardsink.maintenance.gc_parts import collect_parts
from shardsink.maintenance.gc_types import GcOptions, GcReport
from shardsink.maintenance.gc_versions import collect_rollups, collect_versions
from shardsink.maintenance.history import list_state
from shardsink.sinks.cancel import CANCEL_PREFIX  # noqa: F401  (registers the slots' expiring failure markers)
from shardsink.sources.landing import layout as _landing_layout  # noqa: F401  (registers the index and plans)

log = logging.getLogger("shardsink.maintenance.gc")


def collect(shard: Shard, opts: GcOptions | None = None) -> GcReport:
    """Run GC once on ``shard`` (see the module docstring); returns what it did (or would do)."""
    opts = opts or GcOptions()
    admin = shard.admin()
    now = opts.clock()
    cutoff = now - opts.grace_s
    listing = list_state(admin)
    hz = horizon(shard, opts, now=now, listing=listing)
    hook = opts.after_step or (lambda _step: None)
    dry = opts.dry_run
    log.info("gc %s: head %d, oldest retained %d -> %d (bound: %s)%s", shard.url, hz.head, hz.oldest_present,
             hz.oldest, hz.reason, " [dry run]" if dry else "")

    versions = collect_versions(shard, hz, listing, cutoff=cutoff, dry=dry, delete_batch=opts.delete_batch,
                                hook=hook)
    retained_from = versions.retained_from

    rollups_deleted = collect_rollups(admin, listing, retained_from, cutoff=cutoff, dry=dry)
    if not dry:
        hook("rollups")

    parts = collect_parts(shard, retained_from, listing, cutoff=cutoff, dry=dry, hook=hook, lowers=versions.lowers)
    if not dry:
        hook("parts")

    expired = [x for x in ls.all_leases(shard) if x.expires_at + ls.CLOCK_SKEW_S < cutoff]
    leases_expired = len(expired) if dry else ls.expire(shard, now=cutoff)
    if not dry:
        hook("leases")
    plans_deleted = _collect_plans(shard, cutoff=cutoff, dry=dry, batch=opts.delete_batch)

    report = GcReport(
        url=shard.url, dry_run=dry, head=hz.head, oldest_before=hz.oldest_present, oldest_after=retained_from,
        reason=hz.reason, versions_deleted=versions.versions_deleted, rollups_deleted=rollups_deleted,
        parts_deleted=parts.parts, part_bytes_deleted=parts.bytes, manifests_deleted=parts.manifests,
        leases_expired=leases_expired, young_kept=parts.young, still_possible=tuple(parts.still_possible),
        skipped=tuple(parts.skipped), plans_deleted=plans_deleted,
        objects=take_census(shard, now=now, grace_s=opts.grace_s, retention=opts.retention) if dry else None,
    )
    log.info("gc %s: %s %d versions, %d rollups, %d parts (%d bytes), %d manifests, %d leases, %d plans; kept %d "
             "young objects and %d descriptions that may still commit", shard.url,
             "would delete" if dry else "deleted", report.versions_deleted, report.rollups_deleted,
             report.parts_deleted, report.part_bytes_deleted, report.manifests_deleted, report.leases_expired,
             report.plans_deleted, report.young_kept, len(report.still_possible))
    return report


class _OfDescription(msgspec.Struct):
    """What GC reads of a ``when_final`` document: the description it belongs to."""

    desc_id: str
    lower: int | None = None


def _collect_plans(shard: Shard, *, cutoff: float, dry: bool, batch: int) -> int:
    """Step 6: objects older than the grace period under the folders capabilities registered as
    expiring (:func:`shardsink.core.roots.register_root`). ``after_grace``: caches, today
    reclock's bound inputs (``plans/`` in a remap shard's root; a writer slot that finds its own
    gone rebuilds it identical from the remap shard) and the write slots' failure markers
    (``cancel/``, :mod:`shardsink.sinks.cancel`: advisory, read only while their description's
    slots run). ``when_final``: the landing zone's file plans, deleted only once their
    description's fate is final (:func:`_final`)."""
    admin = shard.admin()
    old = [o.key for o in admin.list_expiring() if o.modified <= cutoff]
    pending = [o.key for o in admin.list_expiring("when_final") if o.modified <= cutoff]
    old += _final(shard, pending)
    if not dry:
        for i in range(0, len(old), batch):
            admin.delete_registered(old[i:i + batch])
    return len(old)


def _final(shard: Shard, keys: list[str]) -> list[str]:
    """Those of ``keys`` (``when_final`` documents) whose description is Committed or can never
    commit, decided from ONE head read; a document naming no description (an older mint's) is
    a cache and goes. StillPossible and Unknown keep theirs: never delete on an unknown fate."""
    if not keys:
        return []
    admin, writer, head = shard.admin(), shard.writer(), shard.reader().head()
    out = []
    for key in keys:
        data = admin.get(key)
        if data is None:
            continue
        try:
            doc = msgspec.json.decode(data, type=_OfDescription)
        except (msgspec.DecodeError, msgspec.ValidationError):
            doc = None
        if doc is None or doc.lower is None:
            out.append(key)
            continue
        if isinstance(writer.fate(doc.desc_id, doc.lower, head=head), Committed | CannotCommit):
            out.append(key)
    return out
