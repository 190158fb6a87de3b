"""GC's plan for the state history: the oldest version to retain (:func:`horizon`), and why.

It reads only (leases, the hint, the head and the versions the bisections touch) and
returns a :class:`Horizon`: the versions ``[oldest, head]`` are kept, the ones below are
condemned, and ``stragglers`` an interrupted GC left below a gap go first. The bounds
(retention, leases, grace, idempotency, hint) are described in
:mod:`shardsink.maintenance.gc`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from shardsink.core import leases as ls
from shardsink.core import state as st
from shardsink.core.admin import AdminHandle
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


def horizon(shard: Shard, opts: GcOptions, *, now: float, listing: Listing | None = None) -> Horizon:
    """Compute the oldest version to retain (:mod:`shardsink.maintenance.gc`'s docstring). Reads only.

    SUBTLE: the leases are listed before the head is read; a lease written later pins a
    version its reader reads after writing it, which the grace bound protects until any
    later GC run lists the lease.
    """
    admin = shard.admin()
    leases = ls.live_leases(shard, now=now)
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
    cutoff = now - opts.grace_s
    old = [s for s, o in listing.versions.items() if o.modified <= cutoff and s <= head.seqno]
    g = must_fetch(admin, max(old)) if old else must_fetch(admin, oldest_present)
    bounds: dict[str, int] = {"head": head.header.rollup, "grace": g.header.rollup}
    if g.header.recent:
        bounds["idempotency"] = min(s for _, s in g.header.recent)
    for lease in leases:
        pinned = admin.fetch(lease.seqno)
        bounds[f"lease {lease.lease_id}"] = pinned.header.rollup if pinned is not None else oldest_present
    if hint is not None:
        bounds["hint"] = hint.seqno
    retention = _retention(opts, head.header)
    if retention is None:
        bounds["retention"] = oldest_present
    else:
        bounds["retention"] = _first_past(admin, oldest_present, head, _last_upper(admin, oldest_present, head)
                                          - retention)
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
    return Horizon(head.seqno, oldest_present, oldest, reason, bounds, stragglers)
