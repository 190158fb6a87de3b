"""The commit machine: finds the newest state version, performs the one conditional put.

Object layout under a shard root (versions and rollups are read through
:mod:`shardsink.core.version_store`)::

    state/v/<seqno:020d>.json       immutable state versions (header + diff)
    state/rollup/<seqno:020d>.json  immutable batch lists (written every ROLLUP_EVERY)
    state/LATEST.json               hint: a copy of a recent version, replaced by CAS
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
cached state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core import transitions as tr
from shardsink.core.retry import COMMIT, STORAGE, RetryingBlob, RetryPolicy
from shardsink.core.version_store import VersionStore, rollup_key, version_key
from shardsink.errors import (
    ConditionFailedError,
    CorruptionError,
    ShardExistsError,
    ShardsinkError,
    StorageError,
    UnknownOutcomeError,
)
from shardsink.storage.base import Blob

log = logging.getLogger(__name__)

LATEST = "state/LATEST.json"
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


Step = Callable[[st.Header], "st.Version | tr.Refusal"]
#: A step that also needs the live batch list at the header it is applied to (compaction).
BatchStep = Callable[[st.Header, "tuple[st.BatchMeta, ...]"], "st.Version | tr.Refusal"]


class Machine(VersionStore):
    """I/O and retries around the pure transitions of :mod:`shardsink.core.transitions`: a
    :class:`VersionStore` that also finds the newest version, keeps the hint and commits."""

    def __init__(
        self,
        blob: Blob,
        *,
        storage_policy: RetryPolicy = STORAGE,
        commit_policy: RetryPolicy = COMMIT,
    ) -> None:
        self.raw = blob
        super().__init__(RetryingBlob(blob, policy=storage_policy))
        self.commit_policy = commit_policy
        self._known: tuple[Head, float] | None = None  # the newest head seen, and when
        self.clock: Callable[[], float] = time.monotonic

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

    def create(self, v0: st.Version) -> st.Version:
        """Write version 0 of a new shard; ShardExistsError if anything is there.

        SUBTLE: a lost answer to the create of version 0 is resolved like a commit's:
        re-read version 0 and compare the nonce (ours ⇒ created; someone else's ⇒
        ShardExistsError; missing ⇒ retry the identical create). Otherwise a retry of a
        create that landed would report "already exists; left unchanged".
        """
        if self.blob.get(LATEST) is not None or any(True for _ in self.blob.list("state/v/")):
            raise ShardExistsError(f"a shard already exists at {self.url}; it was left unchanged")
        policy, unsure = self.commit_policy, False
        for attempt in range(policy.attempts):
            try:
                self.blob.create(version_key(0), sc.encode_version(v0))
                break
            except (ConditionFailedError, UnknownOutcomeError) as e:
                if isinstance(e, UnknownOutcomeError):
                    unsure = True
                    policy.sleep(min(policy.max_wait, policy.first_wait * 2**attempt))
                try:
                    landed = self.fetch(0) if unsure else None
                except StorageError as read_failed:
                    raise UnknownOutcomeError(f"{self.url}: create outcome unknown ({read_failed})") from read_failed
                if landed is not None and landed.commit.nonce == v0.commit.nonce:
                    break
                if landed is None and isinstance(e, UnknownOutcomeError):
                    continue  # not there: retrying the same create is safe
                raise ShardExistsError(f"a shard already exists at {self.url}; it was left unchanged") from e
        else:
            raise UnknownOutcomeError(f"{self.url}: create did not settle after {policy.attempts} attempts")
        self._publish_hint(v0, None)
        return v0

    def commit(self, step: Step, *, start: Head | None = None) -> st.Version | tr.Refusal:
        """Apply ``step`` to the newest header and create the next version, exactly once.

        ``start``: a head the caller already read (e.g. :meth:`hinted_head`), saving the
        head read; if it is stale the create of its successor fails and the newer
        versions are probed, exactly as when another writer wins a race.

        This is the only place that performs the conditional put of a state version.
        ``step`` must be pure and deterministic for a given header: after an unknown
        outcome it is re-applied and must produce the same bytes. Any refusal other than
        AlreadyCommitted is returned as is (nothing written).

        SUBTLE: after an unknown outcome (timeout, 409, 5xx) the version may exist,
        written by us. We re-read it and compare the commit nonce before deciding; a
        later refusal ``AlreadyCommitted`` is likewise checked against our nonce.
        Once any attempt had an unknown outcome, a storage failure while re-reading
        leaves the commit unknown, not failed: it is raised as UnknownOutcomeError, never
        as StorageError (which tells callers the write definitely did not apply).
        """
        head = start if start is not None else self.head()
        cur = head.version
        probed = start is None  # cur is known to have been the newest when read
        nonce: str | None = None
        unsure = False  # an earlier create of ours may have landed unseen
        policy = self.commit_policy
        try:
            for attempt in range(policy.attempts):
                out = step(cur.header)
                if isinstance(out, tr.AlreadyCommitted):
                    mine = self.fetch(out.seqno) if nonce is not None else None
                    if mine is not None and mine.commit.nonce == nonce:
                        return self._committed(mine, head.hint_etag)  # ours, landed unseen
                    return out
                if not isinstance(out, st.Version):
                    if not probed:  # a stale start may refuse wrongly: decide on the newest
                        cur, probed = self._advance(cur), True
                        continue
                    return out
                nonce = out.commit.nonce
                try:
                    self.blob.create(version_key(out.seqno), sc.encode_version(out))
                except ConditionFailedError:
                    cur, probed = self._advance(cur), True
                    continue
                except UnknownOutcomeError as e:
                    unsure = True
                    log.warning("commit of seqno %d: %s; re-reading", out.seqno, e)
                    policy.sleep(min(policy.max_wait, policy.first_wait * 2**attempt))
                    landed = self.fetch(out.seqno)
                    if landed is None:
                        continue  # not there (yet): retrying the same create is safe
                    if landed.commit.nonce == nonce:
                        return self._committed(landed, head.hint_etag)
                    cur, probed = self._advance(landed), True
                    continue
                self._versions[out.seqno] = out
                return self._committed(out, head.hint_etag)
        except StorageError as e:
            if not unsure:
                raise
            raise UnknownOutcomeError(
                f"{self.url}: commit outcome unknown: an attempt may have landed and re-reading failed ({e}); "
                "re-read state before retrying"
            ) from e
        raise UnknownOutcomeError(
            f"{self.url}: commit did not settle after {policy.attempts} attempts "
            f"(last seen seqno {cur.seqno}); re-read state before retrying"
        )

    def commit_with_batches(self, step: BatchStep) -> st.Version | tr.Refusal:
        """:meth:`commit` for a step that needs the live batches at the header it sees.

        Each attempt (after a lost race, on the fresh head) recomputes the batch list of
        exactly the version whose header the step receives, so the step can re-check
        what it depends on (a compaction's inputs being live).
        """
        seen: dict[int, tuple[st.BatchMeta, ...]] = {}

        def with_batches(header: st.Header) -> st.Version | tr.Refusal:
            if header.seqno not in seen:
                seen[header.seqno] = self.batches_at(header)
            return step(header, seen[header.seqno])

        return self.commit(with_batches)

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
