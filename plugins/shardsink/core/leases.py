"""Read leases: a reader's promise-keeping token that holds back a shard's ``since``.

A reader that will read a shard *as of* ``t`` for a while (a Spark job) takes a lease
at ``t``: the object ``leases/<lease_id>.json`` under the shard root, holding
``as_of``, ``seqno`` (the newest state version when the lease was written), ``holder``
and ``expires_at``. The holder renews it (rewrites it with a later ``expires_at``)
while it works and deletes it when done; a holder that crashes simply stops renewing
and its lease expires. Only the holder ever writes its lease's key (fresh uuid), so
plain puts suffice: there is no race on a lease object.

Contract maintenance MUST honour (compaction and GC are not implemented yet):

* **Compaction** lists the live leases (:func:`live_leases`, which already adds the
  clock-skew margin) *immediately before* its conditional put and never advances
  ``since`` past ``min(as_of)`` of those leases (:func:`min_leased_as_of`).
* **GC** never deletes a state version ``>= seqno`` of any live lease, nor a part such
  a version references. (A reader pins the version it read *after* writing its lease,
  which is ``>=`` the lease's ``seqno``.)

Why the reader re-checks after writing: a compactor may have listed leases just before
this lease existed and then advanced ``since``. :func:`acquire` therefore writes the
lease first, then reads the state again and refuses (ReadFrontierError, lease released)
if ``since`` already passed ``as_of``. A compactor that commits after that re-read
started its listing before the lease existed; the reader's pinned version is still
protected from GC by the lease's ``seqno``, and its snapshot (of an older version) is
unchanged by compaction by definition.

HAZARD (clocks): liveness compares ``expires_at`` with the reader's wall clock. Holders
renew at a third of the TTL; maintenance treats a lease as live for
:data:`CLOCK_SKEW_S` after its expiry. Hosts whose clocks differ by more than that
break the guarantee.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import msgspec

from shardsink.core import checks as ck
from shardsink.core import keys, roots
from shardsink.core import state as st
from shardsink.core.documents import ENCODER, decode_doc
from shardsink.core.machine import Machine
from shardsink.errors import InvalidUsageError, LeaseLostError, ReadFrontierError, ShardsinkError
from shardsink.storage.base import Blob

log = logging.getLogger(__name__)

PREFIX = roots.LEASES_PREFIX
FORMAT = 1
DEFAULT_TTL_S = 300.0
#: Maintenance keeps a lease for this long after its ``expires_at`` (clock skew margin).
CLOCK_SKEW_S = 30.0

Clock = Callable[[], float]


class LeaseHost(Protocol):
    """What leases need of a shard: its URL (for messages) and its private commit machine
    (``since``, the head's seqno, and its store for the lease objects).
    :class:`shardsink.core.shard.Shard` and its :class:`~shardsink.core.read.ReadHandle` are
    hosts; the handles sit above this module and call it. SUBTLE: the machine is reached by its
    private name, as only core may (``tests/core/test_boundary.py``): callers above core pass a
    handle, never the machine."""

    @property
    def url(self) -> str: ...

    @property
    def _machine(self) -> Machine: ...


def _store(shard: LeaseHost) -> Blob:
    return shard._machine.blob


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """One reader's hold on ``since <= as_of``; times are epoch seconds (floats).

    Also the stored document ``leases/<lease_id>.json`` (with ``format``; unknown fields
    are ignored on read).
    """

    lease_id: str
    as_of: int
    seqno: int
    holder: str
    acquired_at: float
    expires_at: float
    format: int = FORMAT

    @property
    def key(self) -> str:
        return keys.lease_key(self.lease_id)


_ENCODER = ENCODER


def _encode(lease: Lease) -> bytes:
    return _ENCODER.encode(lease)


def _decode(data: bytes, *, where: str) -> Lease:
    """The stored lease at ``where`` through the one document decoder: CorruptionError naming it
    if unreadable or of a newer format. Leases always carried ``format`` (1); a missing one reads as 1."""
    return decode_doc(data, Lease, what="lease", where=where, newest=FORMAT, default_format=1)


def acquire(shard: LeaseHost, as_of: int, *, holder: str, ttl_s: float = DEFAULT_TTL_S,
            clock: Clock = time.time, head: st.Version | None = None) -> Lease:
    """Take a lease at ``as_of`` on ``shard``; ReadFrontierError if ``as_of < since``.

    Checks ``since`` before writing (no lease objects on a bad call or a missing shard)
    and again after (see the module docstring). The upper bound of a read is the
    caller's business: a lease only holds ``since`` back. ``head``: see :func:`acquire_pinned`.
    """
    return acquire_pinned(shard, as_of, holder=holder, ttl_s=ttl_s, clock=clock, head=head)[0]


def acquire_pinned(shard: LeaseHost, as_of: int, *, holder: str, ttl_s: float = DEFAULT_TTL_S,
                   clock: Clock = time.time, head: st.Version | None = None) -> tuple[Lease, st.Version]:
    """:func:`acquire`, returning also the version of the re-check read after the lease was
    written: the version a leased read takes its parts from (GC, which lists leases after it
    computes its horizon, keeps every part that version references while the lease lives).

    ``head``: a version of ``shard`` the caller already read (its one head read) for the check
    before writing; else a fresh head read. SUBTLE: only the re-check must be fresh (it is
    what makes the lease visible to every ``since`` advance after it); the check before is a
    courtesy (no lease object on a bad call), which any version the caller read can give.
    """
    ck.check_seconds(ttl_s, what="lease ttl", positive=True)
    ck.check_time(as_of, what="lease as_of")
    if not isinstance(holder, str) or not holder:
        raise InvalidUsageError(f"lease holder {holder!r} must be a non-empty string")
    head = head if head is not None else shard._machine.head().version
    _check_since(shard, head.header.since, as_of)
    now = clock()
    lease = Lease(lease_id=uuid.uuid4().hex, as_of=as_of, seqno=head.seqno, holder=holder, acquired_at=now,
                  expires_at=now + ttl_s)
    _store(shard).put(lease.key, _encode(lease))
    try:
        pinned = shard._machine.head().version
        _check_since(shard, pinned.header.since, as_of)
    except ShardsinkError:
        release(shard, lease)
        raise
    return lease, pinned


def _check_since(shard: LeaseHost, since: int, as_of: int) -> None:
    if as_of < since:
        raise ReadFrontierError(
            f"as_of {as_of} is not readable on {shard.url}: it is before since ({since}); "
            "times before since have been compacted"
        )


def renew(shard: LeaseHost, lease: Lease, *, ttl_s: float = DEFAULT_TTL_S, clock: Clock = time.time) -> Lease:
    """Extend ``lease``; LeaseLostError if it is gone or already expired (then release it)."""
    ck.check_seconds(ttl_s, what="lease ttl", positive=True)
    now = clock()
    got = _store(shard).get(lease.key)
    if got is None or now > lease.expires_at:
        if got is not None:
            release(shard, lease)
        raise LeaseLostError(
            f"lease {lease.lease_id} on {shard.url} (as_of {lease.as_of}) was lost: "
            f"{'deleted' if got is None else 'expired before renewal'}; the read it protected may be unprotected"
        )
    renewed = msgspec.structs.replace(lease, expires_at=now + ttl_s)
    _store(shard).put(lease.key, _encode(renewed))
    return renewed


def release(shard: LeaseHost, lease: Lease) -> None:
    """Delete ``lease`` (idempotent)."""
    _store(shard).delete(lease.key)


def all_leases(shard: LeaseHost) -> list[Lease]:
    """Every lease object under the shard, live or expired (one LIST + one GET each)."""
    out = []
    store = _store(shard)
    for obj in store.list(PREFIX):
        if not obj.key.endswith(".json"):
            continue
        got = store.get(obj.key)
        if got is not None:  # released between LIST and GET
            out.append(_decode(got.data, where=f"{shard.url}/{obj.key}"))
    return out


def live_leases(shard: LeaseHost, *, now: float | None = None, skew_s: float = CLOCK_SKEW_S) -> list[Lease]:
    """Leases not expired at ``now`` minus the skew margin, oldest first."""
    return live_of(all_leases(shard), now=time.time() if now is None else now, skew_s=skew_s)


def live_of(leases: Iterable[Lease], *, now: float, skew_s: float = CLOCK_SKEW_S) -> list[Lease]:
    """Those of ``leases`` not expired at ``now`` minus the skew margin, oldest first (the others
    are expired: maintenance may delete them)."""
    return sorted((x for x in leases if x.expires_at + skew_s >= now), key=lambda x: (x.acquired_at, x.lease_id))


def min_leased_as_of(shard: LeaseHost, *, now: float | None = None, skew_s: float = CLOCK_SKEW_S) -> int | None:
    """The lowest ``as_of`` any live lease holds (None: no live lease): ``since``'s ceiling."""
    live = live_leases(shard, now=now, skew_s=skew_s)
    return min((x.as_of for x in live), default=None)


def expire(shard: LeaseHost, *, now: float | None = None, skew_s: float = CLOCK_SKEW_S) -> int:
    """Maintenance: delete lease objects expired for longer than the skew margin."""
    t = time.time() if now is None else now
    dead = [x for x in all_leases(shard) if x.expires_at + skew_s < t]
    for x in dead:
        _store(shard).delete(x.key)
    return len(dead)


class LeaseKeeper:
    """Holds leases and renews them from a daemon thread until :meth:`close`.

    ``close`` releases every lease and raises LeaseLostError if one was lost on the way
    (a renewal found it deleted or expired, or renewals kept failing until it expired):
    the job's reads may not have been protected and should be re-run.
    ``after_renewal``: a test hook the thread calls after each round of renewals.
    """

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, clock: Clock = time.time,
                 after_renewal: Callable[[], None] | None = None) -> None:
        self.ttl_s = ck.check_seconds(ttl_s, what="lease ttl", positive=True)
        self.clock, self.after_renewal = clock, after_renewal
        self.held: list[tuple[LeaseHost, Lease]] = []
        self.lost: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, shard: LeaseHost, as_of: int, *, holder: str, head: st.Version | None = None) -> Lease:
        return self.acquire_pinned(shard, as_of, holder=holder, head=head)[0]

    def acquire_pinned(self, shard: LeaseHost, as_of: int, *, holder: str,
                       head: st.Version | None = None) -> tuple[Lease, st.Version]:
        """Take and keep a lease (:func:`acquire_pinned`): the lease and the version to read from."""
        lease, pinned = acquire_pinned(shard, as_of, holder=holder, ttl_s=self.ttl_s, clock=self.clock, head=head)
        with self._lock:
            self.held.append((shard, lease))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shardsink-leases", daemon=True)
                self._thread.start()
        return lease, pinned

    def leases(self) -> Sequence[Lease]:
        with self._lock:
            return [lease for _, lease in self.held]

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew_all()
            if self.after_renewal is not None:
                self.after_renewal()

    def renew_all(self) -> None:
        """Renew every held lease once (the thread calls this every ttl/3)."""
        with self._lock:
            held = list(self.held)
        for i, (shard, lease) in enumerate(held):
            try:
                fresh = renew(shard, lease, ttl_s=self.ttl_s, clock=self.clock)
            except LeaseLostError as e:
                self._drop(lease, str(e))
                continue
            except ShardsinkError as e:  # transient: try again next round, while it lasts
                log.warning("renewing lease %s failed: %s", lease.lease_id, e)
                continue
            with self._lock:
                if i < len(self.held) and self.held[i][1].lease_id == lease.lease_id:
                    self.held[i] = (shard, fresh)

    def _drop(self, lease: Lease, why: str) -> None:
        with self._lock:
            self.held = [(s, x) for s, x in self.held if x.lease_id != lease.lease_id]
            self.lost.append(why)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            held, self.held = self.held, []
        for shard, lease in held:
            try:
                release(shard, lease)
            except ShardsinkError as e:  # it will expire
                log.warning("releasing lease %s failed (it will expire): %s", lease.lease_id, e)
        if self.lost:
            raise LeaseLostError("; ".join(self.lost))
