"""Garbage collection: delete state history outside retention and objects nothing can need.

::

    report = collect(shard, GcOptions(grace_s=3600))        # or dry_run=True

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
   (``Machine.anchor``), so it needs nothing older;
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
6. reclock read plans (``plans/``, caches a writer rebuilds) older than the grace period.

HAZARD (clocks): object ages compare the store's modification times with this host's
clock. Keep clock skew far below the grace period.

HAZARD (compaction): a compaction's output parts are decided like a description's. A
compactor must commit its output within the grace period of writing it, or abandon it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import checks as ck
from shardsink.core import documents as docs
from shardsink.core import fate as ft
from shardsink.core import leases as ls
from shardsink.core import manifests as mf
from shardsink.core import state as st
from shardsink.core.machine import LATEST, Machine, version_key
from shardsink.core.parts import TIME
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, InvalidUsageError, ShardsinkError
from shardsink.maintenance.history import (
    Listing,
    Protected,
    batches_at,
    list_state,
    protected,
    removals,
    retained_start,
)
from shardsink.storage.base import ObjectInfo

log = logging.getLogger("shardsink.maintenance.gc")

DEFAULT_GRACE_S = 3600.0

#: A test hook called after each step (``anchored``, ``version`` (each chunk), ``versions``,
#: ``rollups``, ``desc``, ``parts``, ``leases``); tests inject a crash there.
StepHook = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class GcOptions:
    """``grace_s``: never delete an object younger than this. ``retention``: ms of history
    to keep (``"shard"``: the shard's own ``Header.retention``; None keeps all versions).
    ``dry_run``: decide and report, delete and write nothing. ``clock``: epoch seconds.
    ``after_step``: a test hook (:data:`StepHook`)."""

    grace_s: float = DEFAULT_GRACE_S
    retention: int | Literal["shard"] | None = "shard"
    dry_run: bool = False
    clock: Callable[[], float] = time.time
    after_step: StepHook | None = None
    #: State versions per multi-object delete (S3 takes up to 1,000 keys a request).
    delete_batch: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.delete_batch <= 1000:
            raise InvalidUsageError(f"delete_batch {self.delete_batch} must be between 1 and 1000")
        ck.check_seconds(self.grace_s, what="grace period")  # NaN and inf too: NaN acted as grace 0
        if self.retention is not None and self.retention != "shard":
            ck.check_duration_ms(self.retention, what="retention")


@dataclass(frozen=True)
class Horizon:
    """Where the retained history starts, and why (the binding bound's name)."""

    head: int
    oldest_present: int
    oldest: int
    reason: str
    bounds: dict[str, int]
    #: Condemned versions below a gap under ``oldest_present`` (an interrupted GC's leftovers).
    stragglers: tuple[int, ...] = ()


@dataclass(frozen=True)
class GcReport:
    url: str
    dry_run: bool
    head: int
    oldest_before: int
    oldest_after: int
    reason: str
    versions_deleted: int = 0
    rollups_deleted: int = 0
    parts_deleted: int = 0
    part_bytes_deleted: int = 0
    manifests_deleted: int = 0
    leases_expired: int = 0
    young_kept: int = 0
    still_possible: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default=())
    plans_deleted: int = 0

    @property
    def objects_deleted(self) -> int:
        return (self.versions_deleted + self.rollups_deleted + self.parts_deleted + self.manifests_deleted
                + self.leases_expired + self.plans_deleted)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "still_possible": list(self.still_possible), "skipped": list(self.skipped),
                "objects_deleted": self.objects_deleted}


# --- the horizon ----------------------------------------------------------------------------------


def _retention(opts: GcOptions, h: st.Header) -> int | None:
    if opts.retention == "shard":
        got = getattr(h, "retention", None)  # Header.retention arrives with compaction
        return got if isinstance(got, int) else None
    return opts.retention


def _passed(upper: int | None, t: int) -> bool:
    return upper is None or upper > t


def _first_past(machine: Machine, lo: int, head: st.Version, floor: int) -> int:
    """The first version in ``[lo, head]`` whose upper is past ``floor`` (uppers are monotone)."""
    hi = head.seqno
    if _passed(_must(machine, lo).header.upper, floor):
        return lo
    while hi - lo > 1:  # invariant: lo not past, hi past
        mid = (lo + hi) // 2
        if _passed(_must(machine, mid).header.upper, floor):
            hi = mid
        else:
            lo = mid
    return hi


def _last_upper(machine: Machine, oldest: int, head: st.Version) -> int:
    """The shard's upper, or for a closed shard the last finite one (the closing commit's lower)."""
    if head.header.upper is not None:
        return head.header.upper
    closing = _must(machine, _first_past(machine, oldest, head, _NEVER))
    if closing.commit.lower is not None:
        return closing.commit.lower
    before = machine.fetch(closing.seqno - 1)
    if before is not None and before.header.upper is not None:
        return before.header.upper
    return head.header.since  # nothing better is retained: keep everything since ``since``


_NEVER = 2**63


def _must(machine: Machine, seqno: int) -> st.Version:
    v = machine.fetch(seqno)
    if v is None:
        raise CorruptionError(f"{machine.url}/{version_key(seqno)} is missing from the retained history")
    return v


def horizon(shard: Shard, opts: GcOptions, *, now: float, listing: Listing | None = None) -> Horizon:
    """Compute the oldest version to retain (module docstring). Reads only.

    SUBTLE: the leases are listed before the head is read; a lease written later pins a
    version its reader reads after writing it, which the grace bound protects until any
    later GC run lists the lease.
    """
    machine = shard.machine
    leases = ls.live_leases(shard, now=now)
    hint_got = machine.blob.get(LATEST)
    head = machine.head().version
    listing = listing or list_state(machine)
    # Versions committed after the listing are not gaps (they are newer than it); condemned
    # versions an interrupted multi-object delete left below a gap are stragglers.
    oldest_present = retained_start(machine, listing, min(head.seqno, max(listing.versions, default=head.seqno)))
    stragglers = tuple(s for s in sorted(listing.versions) if s < oldest_present)
    cutoff = now - opts.grace_s
    old = [s for s, o in listing.versions.items() if o.modified <= cutoff and s <= head.seqno]
    g = _must(machine, max(old)) if old else _must(machine, oldest_present)
    bounds: dict[str, int] = {"head": head.header.rollup, "grace": g.header.rollup}
    if g.header.recent:
        bounds["idempotency"] = min(s for _, s in g.header.recent)
    for lease in leases:
        pinned = machine.fetch(lease.seqno)
        bounds[f"lease {lease.lease_id}"] = pinned.header.rollup if pinned is not None else oldest_present
    if hint_got is not None:
        # An unreadable hint makes readers list versions to find the newest: nothing to protect.
        with contextlib.suppress(CorruptionError):
            bounds["hint"] = st.decode_version(hint_got.data, where=f"{shard.url}/{LATEST}").seqno
    retention = _retention(opts, head.header)
    if retention is None:
        bounds["retention"] = oldest_present
    else:
        bounds["retention"] = _first_past(machine, oldest_present, head, _last_upper(machine, oldest_present, head)
                                          - retention)
    reason = min(bounds, key=lambda k: bounds[k])
    oldest = max(oldest_present, min(bounds.values()))
    # Every retained version must be readable on its own chain: ``full_batches(v)`` starts at
    # v's rollup pointer (compaction's fate bisects over retained versions that way). Bases
    # never decrease with seqno, so it is enough that the version after ``oldest`` builds on
    # a rollup at or above it; if not, move back to its base (usually a no-op or one step).
    while oldest < head.seqno:
        nxt = _must(machine, oldest + 1).header.rollup
        if nxt >= oldest or nxt < oldest_present:
            break
        oldest, reason = nxt, f"{reason} (rounded down to rollup {nxt})"
    return Horizon(head.seqno, oldest_present, oldest, reason, bounds, stragglers)


# --- collecting -----------------------------------------------------------------------------------


def collect(shard: Shard, opts: GcOptions | None = None) -> GcReport:
    """Run GC once on ``shard`` (see the module docstring); returns what it did (or would do)."""
    opts = opts or GcOptions()
    machine = shard.machine
    now = opts.clock()
    cutoff = now - opts.grace_s
    listing = list_state(machine)
    hz = horizon(shard, opts, now=now, listing=listing)
    hook = opts.after_step or (lambda _step: None)
    dry = opts.dry_run
    log.info("gc %s: head %d, oldest retained %d -> %d (bound: %s)%s", shard.url, hz.head, hz.oldest_present,
             hz.oldest, hz.reason, " [dry run]" if dry else "")

    versions_deleted = 0
    oldest_now = hz.oldest_present
    target = hz.oldest
    condemned: dict[str, int] = {}
    if target > hz.oldest_present:
        try:
            batches = batches_at(machine, target, listing)
        except CorruptionError as e:
            # e.g. an interrupted run anchored a newer version and the bounds moved back:
            # its chain is gone, so keep every version this time (nothing is lost).
            log.warning("gc %s: cannot anchor version %d (%s); no versions deleted", shard.url, target, e)
            target = hz.oldest_present
        if target > hz.oldest_present:
            # The lowers of batches removed below the new oldest version, read before their
            # versions go (step 4's fate checks need them): from the removal chain (one
            # version per compaction), else from every condemned version.
            chain = removals(machine, _must(machine, hz.head), above=target, down_to=hz.oldest_present - 1)
            condemned = chain.lowers if chain is not None else _lowers_below(machine, hz.oldest_present, target,
                                                                             listing)
        if not dry and target > hz.oldest_present:
            machine.anchor(target, batches)
            hook("anchored")
    # Stragglers of an interrupted run first, then the condemned range, oldest chunk first.
    doomed: list[int] = list(hz.stragglers)
    for s in range(hz.oldest_present, target):
        if listing.versions[s].modified > cutoff:  # never younger than grace (cannot happen by the bound)
            break
        doomed.append(s)
    for i in range(0, len(doomed), opts.delete_batch):
        chunk = doomed[i:i + opts.delete_batch]
        if not dry:
            machine.delete_versions(chunk)
            hook("version")
        versions_deleted += len(chunk)
        oldest_now = max(oldest_now, chunk[-1] + 1)
    if doomed and not dry:
        hook("versions")
    retained_from = target if dry else oldest_now

    # Rollups below the oldest retained version are garbage once it needs none of them:
    # it is anchored (carries a rollup at itself) or is version 0.
    rollups_deleted = 0
    if retained_from == 0 or dry or _anchored(machine, retained_from):
        for r, o in sorted(listing.rollups.items()):
            if r < retained_from and o.modified <= cutoff:
                if not dry:
                    machine.delete_rollup(r)
                rollups_deleted += 1
    if not dry:
        hook("rollups")

    parts = _collect_parts(shard, retained_from, listing, cutoff=cutoff, dry=dry, hook=hook, lowers=condemned)
    if not dry:
        hook("parts")

    expired = [x for x in ls.all_leases(shard) if x.expires_at + ls.CLOCK_SKEW_S < cutoff]
    leases_expired = len(expired) if dry else ls.expire(shard, now=cutoff)
    if not dry:
        hook("leases")
    plans_deleted = _collect_plans(shard, cutoff=cutoff, dry=dry, batch=opts.delete_batch)

    report = GcReport(
        url=shard.url, dry_run=dry, head=hz.head, oldest_before=hz.oldest_present, oldest_after=retained_from,
        reason=hz.reason, versions_deleted=versions_deleted, rollups_deleted=rollups_deleted,
        parts_deleted=parts.parts, part_bytes_deleted=parts.bytes, manifests_deleted=parts.manifests,
        leases_expired=leases_expired, young_kept=parts.young, still_possible=tuple(parts.still_possible),
        skipped=tuple(parts.skipped), plans_deleted=plans_deleted,
    )
    log.info("gc %s: %s %d versions, %d rollups, %d parts (%d bytes), %d manifests, %d leases, %d plans; kept %d "
             "young objects and %d descriptions that may still commit", shard.url,
             "would delete" if dry else "deleted", report.versions_deleted, report.rollups_deleted,
             report.parts_deleted, report.part_bytes_deleted, report.manifests_deleted, report.leases_expired,
             report.plans_deleted, report.young_kept, len(report.still_possible))
    return report


def _anchored(machine: Machine, seqno: int) -> bool:
    v = machine.fetch(seqno)
    return v is not None and v.header.rollup == seqno


@dataclass
class _PartsOutcome:
    parts: int = 0
    bytes: int = 0
    manifests: int = 0
    young: int = 0
    still_possible: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _desc_of(key: str) -> str | None:
    segs = key.split("/")
    return segs[1] if len(segs) >= 3 else None


def _lowers_below(machine: Machine, lo: int, hi: int, listing: Listing) -> dict[str, int]:
    """The lowers of the batches versions ``lo .. hi-1`` knew, read before they are deleted, so
    that step 4 need not read parts to learn the lower of a batch compacted away in them."""
    out: dict[str, int] = {}
    try:
        for b in batches_at(machine, lo, listing):
            out.setdefault(b.desc_id, b.lower)
    except CorruptionError:
        pass  # an interrupted run left lo without its chain: its added batches still help
    for v in machine.fetch_many(range(lo + 1, hi)):
        for b in v.added:
            out.setdefault(b.desc_id, b.lower)
    return out


def _collect_parts(shard: Shard, retained_from: int, listing: Listing, *, cutoff: float, dry: bool,
                   hook: StepHook, lowers: dict[str, int]) -> _PartsOutcome:
    """Step 4: unreferenced parts and manifests older than the grace period, via delete_staged.
    ``lowers``: batch lowers known from the versions this run deleted."""
    machine = shard.machine
    out = _PartsOutcome()
    # SUBTLE: list BEFORE reading what is referenced. A part committed after the listing
    # is referenced by the head read below; one committed after that read was staged by a
    # writer older than the grace period, which the protocol forbids (and fate re-checks).
    listed_parts = list(machine.blob.list("parts/"))
    listed_staging = list(machine.blob.list("staging/"))
    head = machine.head().version
    try:
        refs = protected(machine, retained_from, head, listing if dry else list_state(machine))
    except CorruptionError as e:
        out.skipped.append(f"parts and manifests not collected: the retained history is unreadable ({e})")
        return out

    groups: dict[str, list[ObjectInfo]] = defaultdict(list)
    manifests: dict[str, list[ObjectInfo]] = defaultdict(list)
    for o in listed_parts:
        if refs.covers(o.key):
            continue
        if o.modified > cutoff:
            out.young += 1
            continue
        d = _desc_of(o.key)
        if d is None:
            out.skipped.append(f"{o.key}: not under parts/<description>/; left alone")
            continue
        groups[d].append(o)
    for o in listed_staging:
        d = _desc_of(o.key)
        if d is None:
            out.skipped.append(f"{o.key}: not under staging/<description>/; left alone")
            continue
        manifests[d].append(o)

    condemned: list[ft.Condemned] = []
    sizes: dict[str, int] = {}
    for d in sorted(set(groups) | set(manifests)):
        why = _left_alone(machine, manifests.get(d, []))
        if why is not None:
            out.skipped.append(f"description {d}: {why}")
            continue
        old_manifests = [o for o in manifests.get(d, []) if o.modified <= cutoff]
        out.young += len(manifests.get(d, [])) - len(old_manifests)
        doomed = groups.get(d, []) + old_manifests
        if not doomed:
            continue
        lower = refs.lowers.get(d, lowers.get(d))
        if lower is None:
            lower = _manifest_lower(machine, manifests.get(d, []))
        if lower is None and groups.get(d):
            lower = _min_time(machine, groups[d])
        if lower is None:
            out.skipped.append(f"description {d}: lower unknown (no retained batch, manifest or readable part); kept")
            continue
        sizes.update((o.key, o.size) for o in doomed)
        condemned.append(ft.Condemned(d, lower, frozenset(o.key for o in doomed), manifests=bool(old_manifests)))

    def count_gone(keys: frozenset[str] | None, keep: frozenset[str]) -> None:
        for k in sorted(keys or ()):
            if k in keep:
                continue
            if k.startswith("staging/"):
                out.manifests += 1
            else:
                out.parts += 1
                out.bytes += sizes[k]

    # Descriptions in chunks: each chunk is one head read and one multi-object delete
    # (``delete_staged_many``), so GC costs a few requests per pass, not several per part.
    for i in range(0, len(condemned), _CHUNK):
        chunk = condemned[i:i + _CHUNK]
        if dry:
            for c in chunk:
                try:
                    count_gone(c.only, _predicted_keep(machine, head, refs, c.desc_id, c.lower))
                except ft.DeleteRefusedError:
                    out.still_possible.append(c.desc_id)
            continue
        try:
            results = ft.delete_staged_many(machine, chunk)
        except ShardsinkError as e:
            out.skipped += [f"description {c.desc_id}: {e}" for c in chunk]
            continue
        for c in chunk:
            res = results[c.desc_id]
            if isinstance(res, ft.DeleteRefusedError):
                out.still_possible.append(c.desc_id)
                continue
            count_gone(c.only, res.fate.keys if isinstance(res.fate, ft.Committed) else frozenset())
        hook("desc")
    return out


#: Descriptions per ``delete_staged_many`` call in GC.
_CHUNK = 500


def _predicted_keep(machine: Machine, head: st.Version, refs: Protected, d: str, lower: int) -> frozenset[str]:
    """Dry run: what delete_staged would keep once the versions below the horizon are gone
    (DeleteRefusedError if the description may still commit)."""
    if head.header.committed_seqno(d) is not None:
        fate = ft.read_fate(machine, d, lower)  # its commit version is retained: the real answer
        if isinstance(fate, ft.Committed):
            return fate.keys
    if head.header.upper is not None and head.header.upper <= lower:
        raise ft.DeleteRefusedError(f"{d} may still commit")
    return refs.keys.get(d, frozenset())


def _left_alone(machine: Machine, objs: list[ObjectInfo]) -> str | None:
    """Why a description's staged objects are not GC's to decide (None: they are): it has a
    compaction manifest, or a manifest this shardsink cannot read (garbage, or a newer
    format whose meaning it does not know: never delete what is not understood)."""
    for o in objs:
        got = machine.blob.get(o.key)
        if got is None:
            continue
        try:
            head = mf.decode_head(got.data, where=f"{machine.url}/{o.key}")
        except CorruptionError as e:
            return f"{e}; left alone"
        if head.kind == "compaction":
            # Its fate depends on its inputs being live, which only the compaction module
            # decides (``maintenance.compact.sweep``); a pending one may be mid-commit.
            return "has a compaction manifest; left to the compaction sweep"
    return None


def _manifest_lower(machine: Machine, objs: list[ObjectInfo]) -> int | None:
    """The ``lower`` all of a description's manifests agree on (None: none readable, or they disagree)."""
    lowers: set[int | None] = set()
    for o in objs:
        got = machine.blob.get(o.key)
        if got is None:
            continue
        try:
            lowers.add(mf.decode_head(got.data, where=f"{machine.url}/{o.key}").lower)
        except CorruptionError:
            continue
    lowers.discard(None)
    return lowers.pop() if len(lowers) == 1 else None


def _collect_plans(shard: Shard, *, cutoff: float, dry: bool, batch: int) -> int:
    """Step 6: reclock read plans (``plans/`` in a remap shard's root) older than the grace
    period. They are caches, one per description: a writer slot that finds its plan gone
    rebuilds the identical plan from the remap shard (``shardsink.reclock.plan.load``)."""
    old = [o.key for o in shard.blob.list(docs.PLANS_PREFIX) if o.modified <= cutoff]
    if not dry:
        for i in range(0, len(old), batch):
            shard.blob.delete_many(old[i:i + batch])
    return len(old)


def _min_time(machine: Machine, objs: list[ObjectInfo]) -> int | None:
    """The smallest ``_time`` in the parts ``objs`` (each part's times are >= its batch's lower)."""
    best: int | None = None
    for o in objs:
        got = machine.blob.get(o.key)
        if got is None:
            continue
        try:
            col = pq.read_table(pa.BufferReader(got.data), columns=[TIME], use_threads=False)[TIME]
        except (pa.ArrowException, OSError, KeyError) as e:
            log.warning("gc: part %s is unreadable (%s); its description is kept", o.key, e)
            return None
        if len(col):
            t = pc.min(col).as_py()
            best = t if best is None else min(best, t)
    return best
