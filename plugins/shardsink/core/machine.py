"""The commit machine: finds the newest state version, performs the one conditional put.

Object layout under a shard root (versions and rollups are read through
:mod:`shardsink.core.version_store`)::

    state/v/<seqno:020d>.json       immutable state versions (header + diff)
    state/rollup/<seqno:020d>.json  immutable batch lists (written every ROLLUP_EVERY)
    state/LATEST.json               hint: a copy of a recent version, replaced by CAS
    (keys spelled once, in :mod:`shardsink.core.keys`)
    parts/<desc_id>/<uuid>.parquet  immutable parts

**Finding the newest version** costs a constant number of requests: read the hint
(version ``n``), then probe ``n+1``, ``n+2`` … until one is missing. The hint is only
ever replaced with ``If-Match`` on the etag its writer read, and every writer that
replaces it has probed past the value it read, so the hint never moves backwards;
a writer that crashes before updating it leaves it stale by one version, which the
next reader's probe absorbs.

**Committing** (uncontended: 4 requests) = GET hint, GET ``n+1`` (missing),
create ``n+1`` (``If-None-Match: *``), replace hint (``If-Match``). A writer that read
the hint already passes it as ``start`` and skips the first two: the create is the probe.
A long-lived handle that committed or read the head moments ago starts from what it
knows (:meth:`Machine.known_head`): 2 requests, as persist's writers commit from their
cached state. Every command of :mod:`shardsink.core.commands` is committed by the same loop
(:meth:`Machine.commit`), the create of a shard's version 0 included.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from shardsink.core import after_commit
from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core import transitions as tr
from shardsink.core.clock import WALL
from shardsink.core.commands import Command, CreateCommand, Stamp
from shardsink.core.keys import LATEST, VERSIONS_PREFIX, rollup_key, version_key
from shardsink.core.version_store import VersionStore
from shardsink.errors import (
    ConditionFailedError,
    CorruptionError,
    ShardsinkError,
    StorageError,
    UnknownOutcomeError,
)
from shardsink.storage.base import Blob
from shardsink.storage.retry import COMMIT, RetryingBlob, RetryPolicy

log = logging.getLogger(__name__)

ROLLUP_EVERY = 32
#: How long a handle may start a commit from the head it last saw without reading the hint.
#: SUBTLE: GC keeps every version that was the head within its grace period (default 1 h);
#: a writer whose start is older than the grace could re-create a version GC deleted. Keep
#: this far below any grace period in use.
KNOWN_HEAD_MAX_AGE_S = 30.0


@dataclass(frozen=True)
class Head:
    """The newest version found, and the etag of the hint as read (None: no hint)."""

    version: st.Version
    hint_etag: str | None


def default_writer() -> str:
    """The name a commit carries when its caller names none: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def now_iso() -> str:
    """The wall-clock time a commit is stamped with (ISO 8601, UTC, milliseconds): the
    :data:`shardsink.core.clock.WALL` hook's."""
    return WALL.iso()


@dataclass
class _Run:
    """One :meth:`Machine.commit` call's progress: the command and its stamp, the head it last
    decided on (None: a create, before version 0 is read) and the hint's etag as read; whether
    that head was known to be the newest when read (``probed``), our nonce once we tried a
    create, and whether an earlier create of ours may have landed unseen (``unsure``)."""

    cmd: Command
    stamp: Stamp
    cur: st.Version | None
    etag: str | None
    probed: bool
    nonce: str | None = None
    unsure: bool = False


class Machine(VersionStore):
    """I/O and retries around the pure transitions of :mod:`shardsink.core.transitions`: a
    :class:`VersionStore` that also finds the newest version, keeps the hint and commits."""

    def __init__(
        self,
        blob: Blob,
        *,
        storage_policy: RetryPolicy | None = None,
        commit_policy: RetryPolicy = COMMIT,
    ) -> None:
        # Idempotent: never a wrapper of a wrapper. ``storage_policy`` None keeps the policy of
        # a blob from ``open_blob`` (its ``StoreOptions.retry``), else STORAGE.
        retrying = RetryingBlob(blob, policy=storage_policy)
        self.raw = retrying.inner  # the backend itself (tests and drills count its requests)
        super().__init__(retrying)
        self.commit_policy = commit_policy
        self._known: tuple[Head, float] | None = None  # the newest head seen, and when
        self.clock: Callable[[], float] = time.monotonic
        #: The nonce each commit call is stamped with (a test hook may pin it).
        self.new_nonce: Callable[[], str] = lambda: uuid.uuid4().hex

    # --- reading ------------------------------------------------------------------

    def head(self) -> Head:
        """The newest state version (constant cost unless the hint is missing or unreadable)."""
        hint = self.blob.get(LATEST)
        if hint is not None:
            try:
                v = sc.decode_version(hint.data, where=f"{self.url}/{LATEST}")
                return self._saw(Head(self._advance(v), hint.etag))
            except CorruptionError as e:
                # The hint is a cache: the versions themselves are the truth.
                log.warning("ignoring unreadable hint: %s", e)
        start = self._newest_by_listing()
        return self._saw(Head(self._advance(start), hint.etag if hint is not None else None))

    def hinted_head(self) -> Head:
        """The version the hint holds, WITHOUT probing past it (one request): possibly stale.

        For a writer that commits next (:meth:`commit` with ``start=``): the conditional
        create of the following version is itself the probe, so a stale start costs a
        failed create, never a wrong commit. Only conclusions no newer version can refute
        may be drawn from it (a description recorded as committed stays committed).
        Falls back to :meth:`head` when the hint is missing or unreadable.
        """
        hint = self.blob.get(LATEST)
        if hint is not None:
            try:
                return self._saw(Head(sc.decode_version(hint.data, where=f"{self.url}/{LATEST}"), hint.etag))
            except CorruptionError as e:
                log.warning("ignoring unreadable hint: %s", e)
        return self.head()

    def known_head(self) -> Head:
        """The newest head this handle committed or read in the last ``KNOWN_HEAD_MAX_AGE_S``
        seconds (no request), else :meth:`hinted_head`. Possibly stale, with the same
        contract as :meth:`hinted_head`: a start for :meth:`commit`, whose conditional
        create is the probe.
        """
        if self._known is not None:
            head, seen = self._known
            if self.clock() - seen <= KNOWN_HEAD_MAX_AGE_S:
                return head
        return self.hinted_head()

    def _saw(self, head: Head) -> Head:
        """Remember ``head`` for :meth:`known_head` unless a newer one is known; returns it."""
        known = self._known[0] if self._known is not None else None
        if known is None or head.version.seqno >= known.version.seqno:
            self._known = (head, self.clock())
        return head

    def _advance(self, v: st.Version) -> st.Version:
        """Probe forward from ``v`` until the next version is missing."""
        while True:
            nxt = self.fetch(v.seqno + 1)
            if nxt is None:
                return v
            v = tr.with_rollup(nxt, v.header.rollup)

    # --- writing ------------------------------------------------------------------

    def commit(self, cmd: Command, *, writer: str | None = None, start: Head | None = None
               ) -> st.Version | tr.Refusal:
        """Apply ``cmd`` (:func:`transitions.apply`) to the newest header and create the next
        version, exactly once: the one compare-and-set loop, for every kind of command.

        The call stamps the command once (:class:`~shardsink.core.commands.Stamp`: ``writer``
        (checked by the caller; None: :func:`default_writer`), the time now, a fresh nonce):
        every attempt applies the same stamp.

        ``start``: a head the caller already read (e.g. :meth:`hinted_head`), saving the
        head read; if it is stale the create of its successor fails and the newer
        versions are probed, exactly as when another writer wins a race.

        This is the only place that performs the conditional put of a state version.
        :func:`transitions.apply` is pure and deterministic: after an unknown outcome it is
        re-applied and produces the same bytes. Any refusal other than AlreadyCommitted and
        AlreadyExists is returned as is (nothing written). A compaction is given the live
        batches of exactly the version whose header it is applied to, on every attempt (after
        a lost race, on the fresh head), so it re-checks that its inputs are live. Waits after
        unknown outcomes are the commit policy's (:meth:`RetryPolicy.waits`: jittered, within
        its attempts and deadline); a lost race re-reads at once.

        A :class:`CreateCommand` (version 0) has no head: AlreadyExists when the hint or any
        version is there, or when the create of version 0 is refused.

        SUBTLE: after an unknown outcome (timeout, 409, 5xx) the version may exist,
        written by us. We re-read it and compare the commit nonce before deciding; a
        later refusal ``AlreadyCommitted`` (or ``AlreadyExists``) is likewise checked against
        our nonce. Once any attempt had an unknown outcome, a storage failure while
        re-reading leaves the commit unknown, not failed: it is raised as UnknownOutcomeError,
        never as StorageError (which tells callers the write definitely did not apply).

        SUBTLE: a lost answer to the create of version 0 is resolved like a commit's:
        re-read version 0 and compare the nonce (ours ⇒ created; someone else's ⇒
        AlreadyExists; missing ⇒ retry the identical create). Otherwise a retry of a
        create that landed would report "already exists; left unchanged".
        """
        creating = isinstance(cmd, CreateCommand)
        if creating and (self.blob.get(LATEST) is not None or any(True for _ in self.blob.list(VERSIONS_PREFIX))):
            return tr.AlreadyExists()
        head = None if creating else start if start is not None else self.head()
        stamp = Stamp(writer if writer is not None else default_writer(), now_iso(), self.new_nonce())
        run = _Run(cmd, stamp, head.version if head is not None else None,
                   head.hint_etag if head is not None else None, probed=start is None)
        try:
            out = self._attempts(run)
        except StorageError as e:
            if not run.unsure:
                raise
            raise UnknownOutcomeError(
                f"{self.url}: create outcome unknown ({e})" if creating else
                f"{self.url}: commit outcome unknown: an attempt may have landed and re-reading failed ({e}); "
                "re-read state before retrying"
            ) from e
        if out is not None:
            if isinstance(out, st.Version) and (out.header.options or out.commit.kind == "option"):
                after_commit.notify(self.url, self.blob, out)  # derived views; never raises
            return out
        raise UnknownOutcomeError(
            f"{self.url}: create did not settle after {self.commit_policy.attempts} attempts" if run.cur is None else
            f"{self.url}: commit did not settle after {self.commit_policy.attempts} attempts "
            f"(last seen seqno {run.cur.seqno}); re-read state before retrying"
        )

    def _own_landed(self, seqno: int, run: _Run) -> st.Version | None:
        """Version ``seqno`` committed, if it is the one this run created (by its nonce)."""
        landed = self.fetch(seqno)
        return self._committed(landed, run.etag) if landed is not None and landed.commit.nonce == run.nonce else None

    def _attempts(self, run: _Run) -> st.Version | tr.Refusal | None:
        """:meth:`commit`'s loop: the committed version, a refusal, or None (did not settle)."""
        policy, waits = self.commit_policy, self.commit_policy.waits()
        for _ in range(policy.attempts):
            header = run.cur.header if run.cur is not None else None
            live = self.batches_at(header) if run.cmd.needs_batches and header is not None else ()
            out = tr.apply(header, live, run.cmd, run.stamp)
            if isinstance(out, tr.AlreadyCommitted | tr.AlreadyExists):
                seqno = out.seqno if isinstance(out, tr.AlreadyCommitted) else 0
                mine = self.fetch(seqno) if run.nonce is not None else None
                if mine is not None and mine.commit.nonce == run.nonce:
                    return self._committed(mine, run.etag)  # ours, landed unseen
                return out
            if not isinstance(out, st.Version):
                if not run.probed and run.cur is not None:  # a stale start may refuse wrongly: decide on the newest
                    run.cur, run.probed = self._advance(run.cur), True
                    continue
                return out
            run.nonce = out.commit.nonce
            try:
                self.blob.create(version_key(out.seqno), sc.encode_version(out))
            except ConditionFailedError:
                # SUBTLE: after an unknown outcome, the one refusing this create may be OUR
                # earlier create, landed after we re-read: a command whose rule is not
                # idempotent (since, retention, compaction) would refuse on our own version
                # ("unchanged", "inputs gone"), so check the nonce before deciding.
                if run.unsure and (own := self._own_landed(out.seqno, run)) is not None:
                    return own
                # Another writer won: decide on what is there.
                run.cur = self._advance(run.cur) if run.cur is not None else self.fetch(0)  # a create: version 0
                if run.cur is None:
                    return tr.AlreadyExists()
                run.probed = True
                continue
            except UnknownOutcomeError as e:
                run.unsure = True
                log.warning("commit of seqno %d: %s; re-reading", out.seqno, e)
                wait = next(waits, None)
                if wait is not None:
                    policy.sleep(wait)
                landed = self.fetch(out.seqno)
                if landed is None:
                    if wait is None:
                        return None  # the policy's deadline is spent
                    continue  # not there (yet): retrying the same create is safe
                if landed.commit.nonce == run.nonce:
                    return self._committed(landed, run.etag)
                run.cur, run.probed = self._advance(landed), True
                continue
            self._versions[out.seqno] = out
            return self._committed(out, run.etag)
        return None

    def rollup_now(self) -> int | None:
        """Maintenance: snapshot the head's batch list now (readers then fetch no diffs).

        Best effort, like the rollup every ROLLUP_EVERY commits: writes the rollup object
        and moves the hint to it by CAS (lost to a newer commit: harmless). Returns the
        head's seqno, or None if its rollup is already current or there is no hint.
        """
        head = self.head()
        v = head.version
        if v.header.rollup >= v.seqno or head.hint_etag is None:
            return None
        rolled, etag = self._write_rollup(v, head.hint_etag)
        if etag is not None:
            self._saw(Head(rolled, etag))
        return v.seqno

    def _committed(self, v: st.Version, hint_etag: str | None) -> st.Version:
        etag = self._publish_hint(v, hint_etag)
        if etag is not None and v.seqno - v.header.rollup >= ROLLUP_EVERY:
            v, etag = self._write_rollup(v, etag)
        # A lost hint CAS (etag None) means someone else moved it: the next commit re-reads it.
        self._known = (Head(v, etag), self.clock()) if etag is not None else None
        return v

    def _publish_hint(self, v: st.Version, etag: str | None) -> str | None:
        """Best effort: a lost CAS means someone published a newer hint."""
        try:
            return self.blob.replace(LATEST, sc.encode_version(v), etag=etag)
        except (ConditionFailedError, UnknownOutcomeError, StorageError) as e:
            log.debug("hint not updated to seqno %d: %s", v.seqno, e)
            return None

    def _write_rollup(self, v: st.Version, hint_etag: str) -> tuple[st.Version, str | None]:
        """Maintenance after a commit: snapshot the batch list so reads stay cheap.
        Returns the version as the hint now holds it and the hint's new etag (None: not moved)."""
        try:
            batches = self.full_batches(v)
            self.blob.put(rollup_key(v.seqno), sc.encode_rollup(v.seqno, batches))
            self._rollups[v.seqno] = batches
            rolled = tr.with_rollup(v, v.seqno)
            etag = self._publish_hint(rolled, hint_etag)
            return (rolled, etag) if etag is not None else (v, None)
        except ShardsinkError as e:
            log.warning("rollup at seqno %d skipped: %s", v.seqno, e)
            return v, hint_etag
