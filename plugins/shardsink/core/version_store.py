"""The store of a shard's immutable state versions and rollups: cached reads, GC's rewrites.

Objects (keys: :mod:`shardsink.core.keys`; the hint belongs to :mod:`shardsink.core.machine`):
immutable state versions (header + diff) and immutable batch lists (rollups, written
every ROLLUP_EVERY versions).

A version or rollup never changes once written (GC's :meth:`VersionStore.anchor` only
moves a rollup pointer, a cache), so every read is cached for the life of the handle.
The live batch list at a version is its rollup plus the diffs after it
(:meth:`VersionStore.batches_from`). Finding the newest version and committing are
:class:`shardsink.core.machine.Machine`'s, which is a store with a head and a commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core import transitions as tr
from shardsink.core.keys import VERSIONS_PREFIX, rollup_key, version_key, version_seqno
from shardsink.errors import CorruptionError, ShardNotFoundError, StorageError
from shardsink.storage.retry import RetryingBlob


class VersionStore:
    """Reads (cached) and GC's writes of the state versions and rollups under one shard root."""

    def __init__(self, blob: RetryingBlob) -> None:
        self.blob = blob
        self._versions: dict[int, st.Version] = {}
        self._rollups: dict[int, tuple[st.BatchMeta, ...]] = {}
        self._gone: set[int] = set()  # versions known deleted (missing below an existing one)
        self._newest_fetched = -1

    @property
    def url(self) -> str:
        return self.blob.url

    # --- reading ------------------------------------------------------------------

    def fetch(self, seqno: int) -> st.Version | None:
        """State version ``seqno``, or None if it does not exist (yet, or any more)."""
        cached = self._versions.get(seqno)
        if cached is not None:
            return cached
        if seqno in self._gone:
            return None
        got = self.blob.get(version_key(seqno))
        if got is None:
            # Versions are created in seqno order, so one missing below a version that exists
            # was deleted (GC) and never comes back; one above may not exist *yet*.
            if seqno < self._newest_fetched:
                self._gone.add(seqno)
            return None
        v = sc.decode_version(got.data, where=f"{self.url}/{version_key(seqno)}")
        if v.seqno != seqno:
            raise CorruptionError(f"{self.url}/{version_key(seqno)} claims seqno {v.seqno}")
        self._versions[seqno] = v
        self._newest_fetched = max(self._newest_fetched, seqno)
        return v

    def _newest_by_listing(self) -> st.Version:
        seqnos = [s for o in self.blob.list(VERSIONS_PREFIX) if (s := version_seqno(o.key)) is not None]
        if not seqnos:
            raise ShardNotFoundError(f"no shard at {self.url} (no state versions found)")
        v = self.fetch(max(seqnos))
        if v is None:
            raise StorageError(f"{self.url}: state version {max(seqnos)} vanished while reading")
        return v

    def full_batches(self, v: st.Version) -> tuple[st.BatchMeta, ...]:
        """The live batches at version ``v``: its rollup plus the diffs after it."""
        return self.batches_at(v.header)

    def batches_at(self, header: st.Header) -> tuple[st.BatchMeta, ...]:
        """The live batches at the version ``header`` belongs to (rollup + later diffs)."""
        return self.batches_from(header.rollup, header.seqno)

    def batches_from(self, rollup: int, seqno: int) -> tuple[st.BatchMeta, ...]:
        """The live batches at version ``seqno``: rollup ``rollup`` (0: the empty list) plus
        the diffs of versions ``rollup+1 .. seqno``."""
        base: tuple[st.BatchMeta, ...] = ()
        if rollup > 0:
            got = self.rollup(rollup)
            if got is None:
                raise CorruptionError(f"{self.url}: rollup {rollup} referenced by version {seqno} is missing")
            base = got
        return tr.apply_diffs(base, self.fetch_many(range(rollup + 1, seqno + 1)))

    def rollup(self, seqno: int) -> tuple[st.BatchMeta, ...] | None:
        """The batch list of rollup ``seqno``, or None if it does not exist.

        Cached: a rollup is the exact batch list at its seqno, so every write of one
        (a commit's, maintenance's, GC's anchor) has the same content."""
        cached = self._rollups.get(seqno)
        if cached is not None:
            return cached
        got = self.blob.get(rollup_key(seqno))
        if got is None:
            return None
        batches = sc.decode_rollup(got.data, where=f"{self.url}/{rollup_key(seqno)}")[1]
        self._rollups[seqno] = batches
        return batches

    def fetch_many(self, seqnos: Iterable[int]) -> list[st.Version]:
        wanted = list(seqnos)
        missing = [s for s in wanted if s not in self._versions]
        if missing:
            with ThreadPoolExecutor(max_workers=16) as pool:
                got = list(pool.map(self.fetch, missing))
            gone = [s for s, v in zip(missing, got, strict=True) if v is None]
            if gone:
                raise CorruptionError(f"{self.url}: state versions {gone[:5]} are missing from the history")
        return [self._versions[s] for s in wanted]

    # --- maintenance --------------------------------------------------------------

    def anchor(self, seqno: int, batches: tuple[st.BatchMeta, ...]) -> st.Version:
        """Make version ``seqno`` self-contained: GC calls this before deleting anything older.

        Writes the rollup ``state/rollup/<seqno>`` (``batches`` must be the live batch list
        at ``seqno``; the caller computed it from an intact chain) unless it exists, then
        rewrites version ``seqno`` with ``header.rollup = seqno`` so that
        :meth:`full_batches` of it needs no older version. Returns the anchored version.

        SUBTLE: this is the only rewrite of an existing state version. It changes nothing
        but the rollup pointer, which is a cache (the hint carries newer pointers the same
        way), so a reader that sees either copy computes the same batch list. The rewrite is
        a conditional replace on the etag just read: it can never resurrect a version that a
        concurrent GC deleted (that would open a gap in the retained chain).
        """
        key = version_key(seqno)
        got = self.blob.get(key)
        if got is None:
            raise CorruptionError(f"{self.url}/{key}: cannot anchor a missing state version")
        v = sc.decode_version(got.data, where=f"{self.url}/{key}")
        if self.blob.get(rollup_key(seqno)) is None:
            self.blob.put(rollup_key(seqno), sc.encode_rollup(seqno, batches))
        if v.header.rollup == seqno:
            return v
        anchored = tr.with_rollup(v, seqno)
        self.blob.replace(key, sc.encode_version(anchored), etag=got.etag)
        self._versions[seqno] = anchored
        return anchored

    def fetch_upto_gap(self, seqnos: Iterable[int]) -> list[st.Version]:
        """The versions ``seqnos`` (fetched in parallel) up to, not including, the first missing one.

        For history walks newest first: GC deletes versions oldest first, so the history
        of a collected shard simply ends at the oldest retained version.
        """
        wanted = list(seqnos)
        with ThreadPoolExecutor(max_workers=16) as pool:
            got = list(pool.map(self.fetch, wanted))
        out: list[st.Version] = []
        for v in got:
            if v is None:
                break
            out.append(v)
        return out

    def delete_rollup(self, seqno: int) -> None:
        """GC only: delete rollup ``seqno``. SUBTLE: only below an anchored oldest retained
        version (:meth:`anchor`), which no longer needs any older rollup."""
        self.blob.delete(rollup_key(seqno))

    def delete_versions(self, seqnos: Sequence[int]) -> None:
        """GC only: delete state versions ``seqnos`` (``RetryingBlob.delete_many``: one
        multi-object delete per 1,000, a plain DELETE for one) and forget any cached copies.

        SUBTLE: only versions below an anchored version (:meth:`anchor`), oldest chunk first.
        Within one multi-object delete S3 removes keys in no particular order, so a failure
        can leave condemned versions below a gap; the anchored version above it starts the
        retained chain (``maintenance.history.retained_start``) and ``core.fate``'s search
        stays safe: a version below the chain either answers truthfully or is skipped.
        """
        self.blob.delete_many([version_key(s) for s in seqnos])
        for seqno in seqnos:
            self._versions.pop(seqno, None)
            self._gone.add(seqno)
