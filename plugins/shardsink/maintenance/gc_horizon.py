"""GC's plan for the state history: the oldest version to retain (:func:`horizon`), and why.

It reads only (leases, the hint, the head and the versions the bisections touch) and
returns a :class:`Horizon`: the versions ``[oldest, head]`` are kept, the ones below are
condemned, and ``stragglers`` an interrupted GC left below a gap go first. The bounds
(retention, leases, grace, idempotency, hint) are described in
:mod:`shardsink.maintenance.gc`.

The reads (:func:`read_horizon`) are apart from the decision (:func:`horizon_at`), so that
:func:`releases` can ask when the horizon passes a version: when GC may delete the parts only
older retained versions reference (:mod:`shardsink.core.census`'s "awaiting GC").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from shardsink.core import leases as ls
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.admin import AdminHandle
from shardsink.core.census import Release, iso
from shardsink.core.commits import CloseCommit
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.history import Listing, list_state, retained_start


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


def _retention(opts: GcOptions, h: st.Header) -> int | None:
    if opts.retention == "shard":
        got = getattr(h, "retention", None)  # Header.retention arrives with compaction
        return got if isinstance(got, int) else None
    return opts.retention


def _passed(upper: int | None, t: int) -> bool:
    return upper is None or upper > t


def _first_past(admin: AdminHandle, lo: int, head: st.Version, floor: int) -> int:
    """The first version in ``[lo, head]`` whose upper is past ``floor`` (uppers are monotone)."""
    hi = head.seqno
    if _passed(must_fetch(admin, lo).header.upper, floor):
        return lo
    while hi - lo > 1:  # invariant: lo not past, hi past
        mid = (lo + hi) // 2
        if _passed(must_fetch(admin, mid).header.upper, floor):
            hi = mid
        else:
            lo = mid
    return hi


def _last_upper(admin: AdminHandle, oldest: int, head: st.Version) -> int:
    """The shard's upper, or for a closed shard the last finite one (the closing commit's lower)."""
    if head.header.upper is not None:
        return head.header.upper
    closing = must_fetch(admin, _first_past(admin, oldest, head, _NEVER))
    if isinstance(closing.commit, CloseCommit):
        return closing.commit.lower
    before = admin.fetch(closing.seqno - 1)
    if before is not None and before.header.upper is not None:
        return before.header.upper
    return head.header.since  # nothing better is retained: keep everything since ``since``


_NEVER = 2**63


def must_fetch(admin: AdminHandle, seqno: int) -> st.Version:
    """Version ``seqno``, which the retained history must hold (CorruptionError if it is missing)."""
    v = admin.fetch(seqno)
    if v is None:
        raise CorruptionError(f"{admin.url}/{admin.version_object(seqno)} is missing from the retained history")
    return v


@dataclass(frozen=True)
class HorizonRead:
    """What the horizon reads once (:func:`read_horizon`); :func:`horizon_at` decides from it at any time."""

    admin: AdminHandle
    head: st.Version
    listing: Listing
    oldest_present: int
    stragglers: tuple[int, ...]
    #: Every lease object (live or expired), and the leases live at the read's time.
    leases: tuple[ls.Lease, ...]
    live_leases: tuple[ls.Lease, ...]
    hint: st.Version | None
    retention: int | None


def read_horizon(shard: Shard, opts: GcOptions, *, now: float, listing: Listing | None = None) -> HorizonRead:
    """The reads :func:`horizon` decides from: leases (live at ``now``), the hint, the head, the
    state listing (``listing``: one made before the head read) and the retained chain's start.

    SUBTLE: the leases are listed before the head is read; a lease written later pins a
    version its reader reads after writing it, which the grace bound protects until any
    later GC run lists the lease.
    """
    admin = shard.admin()
    leases = tuple(ls.all_leases(shard))
    live = tuple(ls.live_of(leases, now=now))
    hint: st.Version | None = None
    with contextlib.suppress(CorruptionError):
        # An unreadable hint makes readers list versions to find the newest: nothing to protect.
        hint = admin.hint()
    head = admin.head()
    listing = listing or list_state(admin)
    # Versions committed after the listing are not gaps (they are newer than it); condemned
    # versions an interrupted multi-object delete left below a gap are stragglers.
    oldest_present = retained_start(admin, listing, min(head.seqno, max(listing.versions, default=head.seqno)))
    stragglers = tuple(s for s in sorted(listing.versions) if s < oldest_present)
    return HorizonRead(admin, head, listing, oldest_present, stragglers, leases, live, hint,
                       _retention(opts, head.header))


def horizon(shard: Shard, opts: GcOptions, *, now: float, listing: Listing | None = None) -> Horizon:
    """Compute the oldest version to retain (:mod:`shardsink.maintenance.gc`'s docstring). Reads only."""
    return horizon_at(read_horizon(shard, opts, now=now, listing=listing), now=now, grace_s=opts.grace_s)


def horizon_at(hr: HorizonRead, *, now: float, grace_s: float) -> Horizon:
    """The horizon of ``hr`` if GC ran at ``now`` with grace ``grace_s`` (the leases as read).
    Reads only the versions its bisections touch (cached: they are immutable)."""
    admin, head, oldest_present = hr.admin, hr.head, hr.oldest_present
    cutoff = now - grace_s
    old = [s for s, o in hr.listing.versions.items() if o.modified <= cutoff and s <= head.seqno]
    g = must_fetch(admin, max(old)) if old else must_fetch(admin, oldest_present)
    bounds: dict[str, int] = {"head": head.header.rollup, "grace": g.header.rollup}
    if g.header.recent:
        bounds["idempotency"] = min(s for _, s in g.header.recent)
    for lease in hr.live_leases:
        pinned = admin.fetch(lease.seqno)
        bounds[f"lease {lease.lease_id}"] = pinned.header.rollup if pinned is not None else oldest_present
    if hr.hint is not None:
        bounds["hint"] = hr.hint.seqno
    if hr.retention is None:
        bounds["retention"] = oldest_present
    else:
        bounds["retention"] = _first_past(admin, oldest_present, head, _last_upper(admin, oldest_present, head)
                                          - hr.retention)
    reason = min(bounds, key=lambda k: bounds[k])
    oldest = max(oldest_present, min(bounds.values()))
    # Every retained version must be readable on its own chain: ``full_batches(v)`` starts at
    # v's rollup pointer (compaction's fate bisects over retained versions that way). Bases
    # never decrease with seqno, so it is enough that the version after ``oldest`` builds on
    # a rollup at or above it; if not, move back to its base (usually a no-op or one step).
    while oldest < head.seqno:
        nxt = must_fetch(admin, oldest + 1).header.rollup
        if nxt >= oldest or nxt < oldest_present:
            break
        oldest, reason = nxt, f"{reason} (rounded down to rollup {nxt})"
    return Horizon(head.seqno, oldest_present, oldest, reason, bounds, hr.stragglers)


def releases(hr: HorizonRead, removed_at: Iterable[int], *, now: float, grace_s: float) -> dict[int, Release]:
    """For each version ``r`` of ``removed_at`` (one that removed batches), when GC may delete what
    only the versions below it reference: the earliest time from ``now`` on at which
    :func:`horizon_at` passes ``r - 1``. New commits only move the horizon forward; a new lease
    may hold it back, so the time is when GC may, not when it will. Time alone never gets there
    when a bound other than grace holds it: then :attr:`Release.waits` says what does."""
    current = horizon_at(hr, now=now, grace_s=grace_s).oldest
    far = horizon_at(hr, now=math.inf, grace_s=grace_s)  # every version older than the grace period
    # The horizon moves only when a version turns older than the grace period: bisect those times.
    times = sorted(o.modified + grace_s for s, o in hr.listing.versions.items()
                   if s <= hr.head.seqno and o.modified + grace_s > now)
    out: dict[int, Release] = {}
    for r in sorted(set(removed_at)):
        if current >= r:
            out[r] = Release(r - 1, now)
        elif far.oldest < r:
            out[r] = Release(r - 1, None, _waits(hr, far, r))
        else:  # ``times`` is not empty: the horizon at ``now`` is not yet ``far``
            out[r] = Release(r - 1, _earliest(hr, times, r, grace_s=grace_s))
    return out


def _earliest(hr: HorizonRead, times: list[float], removed_at: int, *, grace_s: float) -> float:
    """The first of ``times`` at which the horizon passes ``removed_at - 1`` (the last one does:
    every listed version is old then, as in ``far``)."""
    lo, hi = 0, len(times) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if horizon_at(hr, now=times[mid], grace_s=grace_s).oldest >= removed_at:
            hi = mid
        else:
            lo = mid + 1
    return times[lo]


def _waits(hr: HorizonRead, far: Horizon, removed_at: int) -> tuple[str, ...]:
    """What the bounds holding ``far`` (the horizon once every version is old) below ``removed_at`` wait for."""
    out = [_wait(hr, name, removed_at) for name, seqno in far.bounds.items() if seqno < removed_at]
    return tuple(dict.fromkeys(out or [_wait(hr, "head", removed_at)]))  # none: rounded down to a rollup


def _wait(hr: HorizonRead, bound: str, removed_at: int) -> str:
    if bound == "retention":
        if hr.retention is None:
            return ("a retention on the shard (it keeps all history while none is set: "
                    "`shardsink retention URL --set 7d`)")
        upper = must_fetch(hr.admin, removed_at - 1).header.upper
        if upper is None:
            return "nothing: the shard was closed then, and retention keeps its last window"
        return (f"the shard's upper reaching {upper + hr.retention} (its upper at version {removed_at - 1}, "
                f"{upper}, plus the retention, {hr.retention} ms)")
    if bound == "idempotency":
        recent = hr.head.header.recent
        n = sum(1 for _, s in recent if s < removed_at) + max(0, tr.RECENT_DESCS - len(recent))
        return (f"{n} more descriptions committing (GC keeps the versions that committed the last "
                f"{tr.RECENT_DESCS}, so that a retried append is told it committed)")
    lease = next((x for x in hr.live_leases if bound == f"lease {x.lease_id}"), None)
    if lease is not None:
        return (f"read lease {lease.lease_id} of {lease.holder} ending (it pins version {lease.seqno}; it expires "
                f"at {iso(lease.expires_at)} unless renewed)")
    if bound == "hint":
        return f"the hint moving past version {removed_at - 1} (it moves with each rollup)"
    return (f"a commit made on a rollup at or after version {removed_at} (rollups are written periodically, and "
            "after a maintenance pass compacts)")
