"""The maintenance handle: what compaction, since/retention, GC and verify may do to a shard.

::

    admin = shard.admin()
    head = admin.head()                                   # the newest state version
    listing = admin.list_state()                          # versions and rollups by seqno
    out = admin.commit(SinceCommand(...))                 # the one compare-and-set loop
    gone = admin.delete_staged(desc_id, lower)            # re-checks the fate, then deletes

Maintenance's algorithms (plans, merges, GC's horizon, verify's checks) live in
:mod:`shardsink.maintenance`; this module is the thin, typed surface they go through,
as persist keeps its GC beside ``internal/machine.rs`` and exposes nothing else. Nothing
above ``core/`` touches the commit machine, the blob or a raw key: every object this handle
reads, lists or deletes is checked to belong to the shard layout
(:func:`shardsink.core.roots.known`); anything else is refused with InvalidUsageError.
What a key is, and the key a report names, come from the handle too
(:meth:`AdminHandle.version_object`, :meth:`AdminHandle.is_compaction`, ...): maintenance
never spells the layout (``tests/core/test_boundary.py`` holds every layer above core to it).

Deleting is narrow on purpose. Staged data (``parts/``, ``staging/``) goes only through
:meth:`AdminHandle.delete_staged` / :meth:`AdminHandle.delete_staged_many` (the one
deleter of :mod:`shardsink.core.fate`, which re-derives the fate right before deleting);
state history only through :meth:`AdminHandle.delete_versions` /
:meth:`AdminHandle.delete_rollup` (GC, below an anchored version); lease objects through
:func:`shardsink.core.leases.expire`; root objects capabilities registered only through
:meth:`AdminHandle.delete_registered`; a whole closed shard only through
:meth:`AdminHandle.drop_closed` (``shardsink drop``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import pyarrow.parquet as pq

from shardsink.core import fate as ft
from shardsink.core import keys, roots
from shardsink.core import manifests as mf
from shardsink.core import part_io as pio
from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core import transitions as tr
from shardsink.core.builder import BatchBuilder, PartOptions
from shardsink.core.checks import check_desc_id, check_writer
from shardsink.core.commands import CompactCommand, OptionCommand, RetentionCommand, SinceCommand
from shardsink.core.machine import Machine
from shardsink.core.objects import (
    DROP_KINDS,
    Dropped,
    StagedObject,
    StateObjects,
    drop_kind,
    is_manifest,
    staged_desc_id,
)
from shardsink.errors import InvalidUsageError
from shardsink.storage.base import ObjectInfo

__all__ = [
    "DROP_KINDS", "AdminHandle", "Dropped", "MaintenanceCommand", "StagedObject", "StateObjects", "drop_kind",
    "is_manifest", "staged_desc_id",
]

#: The commands maintenance commits (appends, closes and creates go through the write path).
MaintenanceCommand = CompactCommand | SinceCommand | RetentionCommand | OptionCommand


def _layout_key(key: str) -> str:
    """``key`` if it belongs to the shard layout (core's prefixes or a registered root object)."""
    if not isinstance(key, str) or not key or key.startswith("/") or ".." in key.split("/") or not roots.known(key):
        raise InvalidUsageError(f"{key!r} is not an object of the shard layout; the maintenance handle refuses it",
                                value=str(key)[:300])
    return key


class AdminHandle:
    """Maintenance's view of one shard (from :meth:`shardsink.core.shard.Shard.admin`).

    Cheap: it shares the shard handle's commit machine, so reads are cached for both.
    Reads of versions and rollups are cached (they are immutable); listings are not.
    """

    def __init__(self, machine: Machine) -> None:
        self._m = machine

    @property
    def url(self) -> str:
        return self._m.url

    # --- what a key is: reports name objects by key, only core spells one -----------------

    @property
    def hint_object(self) -> str:
        """The hint's key (``state/LATEST.json``), relative to the shard root."""
        return keys.LATEST

    @property
    def versions_folder(self) -> str:
        """The folder state versions live in (``state/v/``)."""
        return keys.VERSIONS_PREFIX

    def version_object(self, seqno: int) -> str:
        """The key of state version ``seqno``, relative to the shard root."""
        return keys.version_key(seqno)

    def rollup_object(self, seqno: int) -> str:
        """The key of rollup ``seqno``, relative to the shard root."""
        return keys.rollup_key(seqno)

    def is_known(self, key: str) -> bool:
        """Whether ``key`` belongs to the layout (core's objects or a registered root object);
        verify reports any other object as unknown, and nothing deletes it."""
        return roots.known(key)

    def is_part(self, key: str) -> bool:
        """Whether ``key`` names a part (an object under ``parts/``)."""
        return key.startswith(roots.PARTS_PREFIX)

    @staticmethod
    def new_compaction_id() -> str:
        """A fresh compaction id: what it stages is decided by the compaction sweep
        (:meth:`list_compaction_manifests`), never by description GC."""
        return f"{keys.COMPACTION_ID_PREFIX}{uuid.uuid4().hex}"

    @staticmethod
    def is_compaction(desc_id: str) -> bool:
        """Whether ``desc_id`` is a compaction id (:meth:`new_compaction_id`)."""
        return desc_id.startswith(keys.COMPACTION_ID_PREFIX)

    # --- state: reads ---------------------------------------------------------------

    def head(self) -> st.Version:
        """The newest state version (hint, then probing forward)."""
        return self._m.head().version

    def fetch(self, seqno: int) -> st.Version | None:
        """State version ``seqno``, or None if it does not exist (yet, or any more)."""
        return self._m.fetch(seqno)

    def fetch_many(self, seqnos: Iterable[int]) -> list[st.Version]:
        """Versions ``seqnos`` in parallel; CorruptionError if any is missing."""
        return self._m.fetch_many(seqnos)

    def full_batches(self, v: st.Version) -> tuple[st.BatchMeta, ...]:
        """The live batches at ``v`` (its rollup plus the diffs after it)."""
        return self._m.full_batches(v)

    def batches_at(self, header: st.Header) -> tuple[st.BatchMeta, ...]:
        """The live batches at the version ``header`` belongs to."""
        return self._m.batches_at(header)

    def batches_from(self, rollup: int, seqno: int) -> tuple[st.BatchMeta, ...]:
        """The live batches at ``seqno`` from rollup ``rollup`` (0: empty) plus later diffs.
        CorruptionError if the rollup or a diff is missing."""
        return self._m.batches_from(rollup, seqno)

    def list_state(self) -> StateObjects:
        """One listing of ``state/``: every version and rollup object present, by seqno.

        HAZARD: a listing is a moment; versions committed after it are missing from it
        (callers read the head before or after, as their argument needs)."""
        versions: dict[int, ObjectInfo] = {}
        rollups: dict[int, ObjectInfo] = {}
        for o in self._m.blob.list(roots.STATE_PREFIX):
            if (s := keys.version_seqno(o.key)) is not None:
                versions[s] = o
            elif (s := keys.rollup_seqno(o.key)) is not None:
                rollups[s] = o
        return StateObjects(versions, rollups)

    def hint(self) -> st.Version | None:
        """The version the hint (``state/LATEST.json``) holds, unprobed; None if there is no hint.
        CorruptionError if it does not decode (readers then list versions: it is a cache)."""
        got = self._m.blob.get(keys.LATEST)
        return None if got is None else sc.decode_version(got.data, where=f"{self.url}/{keys.LATEST}")

    # --- state: writes ----------------------------------------------------------------

    def commit(self, command: MaintenanceCommand, *, writer: str | None = None) -> st.Version | tr.Refusal:
        """Commit a maintenance command by the one compare-and-set loop (``Machine.commit``).

        Returns the version written or the rule's refusal (nothing written). Raises
        UnknownOutcomeError when the outcome is unknown: re-read before deciding anything.
        Appends, closes and creates are refused here (InvalidUsageError): they go through
        the shard handle, which settles their fate after a refusal. ``writer``: the name the
        commit carries (default: this host and process).
        """
        if getattr(command, "family", None) != "maintenance":
            raise InvalidUsageError(f"the maintenance handle commits compaction, since, retention and option commands, "
                                    f"not {type(command).__name__}")
        return self._m.commit(command, writer=check_writer(writer) if writer is not None else None)

    def rollup_now(self) -> int | None:
        """Write a rollup of the head's batch list and move the hint to it (best effort).
        Returns the head's seqno, or None if its rollup is already current or there is no hint."""
        return self._m.rollup_now()

    def anchor(self, seqno: int, batches: tuple[st.BatchMeta, ...]) -> st.Version:
        """GC step 1: make version ``seqno`` self-contained (rollup at itself).

        HAZARD: ``batches`` must be the live batch list at ``seqno``, computed from an
        intact chain; the rewrite is conditional on the etag read, so it never resurrects a
        version another GC deleted (:meth:`shardsink.core.version_store.VersionStore.anchor`)."""
        return self._m.anchor(seqno, batches)

    def delete_versions(self, seqnos: Sequence[int]) -> None:
        """GC step 2: delete state versions ``seqnos`` (one multi-object delete per 1,000).

        HAZARD: only versions below an anchored version, oldest chunk first, none younger
        than the grace period: a deleted version above the retained chain is a fork."""
        self._m.delete_versions(seqnos)

    def delete_rollup(self, seqno: int) -> None:
        """GC step 3: delete rollup ``seqno``. HAZARD: only below the anchored oldest version."""
        self._m.delete_rollup(seqno)

    # --- fates and the one deleter of staged data ---------------------------------------

    def fate(self, desc_id: str, lower: int, *, inputs: Sequence[st.BatchMeta] | None = None) -> ft.Fate:
        """The fate of ``desc_id`` (``inputs`` given: compaction ``desc_id`` of those batches),
        from one fresh state read (:func:`shardsink.core.fate.read_fate`)."""
        return ft.read_fate(self._m, desc_id, lower, inputs=inputs)

    def delete_staged(self, desc_id: str, lower: int, *, only: Iterable[str] | None = None, manifests: bool = True,
                      inputs: Sequence[st.BatchMeta] | None = None) -> ft.Deleted:
        """Delete what ``desc_id`` staged that its fate lets go (:func:`shardsink.core.fate.delete_staged`).

        Re-derives the fate from a fresh read first: StillPossible raises DeleteRefusedError
        (nothing deleted); Committed keeps its batch; ``only`` restricts the keys considered."""
        return ft.delete_staged(self._m, desc_id, lower, only=None if only is None else list(only),
                                manifests=manifests, inputs=inputs)

    def delete_staged_many(self, condemned: Sequence[ft.Condemned]) -> dict[str, ft.Deleted | ft.DeleteRefusedError]:
        """:meth:`delete_staged` for many descriptions: every fate from ONE head read, then
        multi-object deletes (:func:`shardsink.core.fate.delete_staged_many`)."""
        return ft.delete_staged_many(self._m, condemned)

    # --- staged objects -------------------------------------------------------------------

    def list_parts(self) -> list[StagedObject]:
        """One listing of ``parts/``, each object with the id owning it."""
        return [StagedObject(o, staged_desc_id(o.key), "part") for o in self._m.blob.list(roots.PARTS_PREFIX)]

    def list_manifests(self) -> list[StagedObject]:
        """One listing of ``staging/``, each manifest with the id owning it."""
        return [StagedObject(o, staged_desc_id(o.key), "manifest") for o in self._m.blob.list(roots.STAGING_PREFIX)]

    def list_compaction_manifests(self) -> list[StagedObject]:
        """The compactions' manifests of their inputs, from one listing of ``staging/``."""
        return [o for o in self.list_manifests() if keys.is_compaction_manifest(o.key)]

    def list_staged(self, desc_id: str) -> list[StagedObject]:
        """What ``desc_id`` staged: one listing of ``parts/<desc_id>/`` and one of ``staging/<desc_id>/``."""
        parts_prefix, staging_prefix = keys.staged_prefixes(check_desc_id(desc_id))
        return ([StagedObject(o, desc_id, "part") for o in self._m.blob.list(parts_prefix)]
                + [StagedObject(o, desc_id, "manifest") for o in self._m.blob.list(staging_prefix)])

    def put_compaction_manifest(self, doc: mf.CompactionManifestDoc) -> str:
        """Write compaction ``doc.compaction_id``'s manifest of its inputs; returns its key.
        Written before any output part, so a crash leaves a manifest the sweep decides by."""
        key = keys.compaction_manifest_key(check_desc_id(doc.compaction_id))
        self._m.blob.put(key, mf.encode(doc))
        return key

    def builder(self, cid: str, *, options: PartOptions | None = None) -> BatchBuilder:
        """The batch builder for compaction ``cid``'s output parts (under ``parts/<cid>/``,
        through the retrying blob). The parts stay invisible until a command commits them."""
        return BatchBuilder(self._m.blob, check_desc_id(cid), options=options or PartOptions())

    def open_part(self, p: st.PartMeta) -> pq.ParquetFile:
        """Part ``p`` as a Parquet file; CorruptionError if missing, unreadable or its row
        count is not the recorded one."""
        return pio.open_part(self._m.blob, _part(p))

    # --- any object of the layout -------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The bytes of layout object ``key`` (None: absent). InvalidUsageError outside the layout."""
        got = self._m.blob.get(_layout_key(key))
        return None if got is None else got.data

    def list_objects(self) -> list[ObjectInfo]:
        """Every object under the shard root, known or not (verify reports unknown ones).
        Cost: one listing of the whole shard."""
        return list(self._m.blob.list(""))

    def list_registered(self, prefix: str) -> list[ObjectInfo]:
        """The objects under a folder a capability registered (:func:`shardsink.core.roots.register_root`)."""
        if not any(o.prefix and o.key == prefix for o in roots.registered()):
            raise InvalidUsageError(f"{prefix!r} is not a registered root folder", value=prefix[:300])
        return list(self._m.blob.list(prefix))

    def list_expiring(self, expiry: roots.Expiry = "after_grace") -> list[ObjectInfo]:
        """The objects under every folder a capability registered as expiring after GC's grace
        period (``expiry="after_grace"``: caches rebuilt when missing; ``"when_final"``:
        documents of a description, kept while it may commit). One listing per folder."""
        return [o for prefix in roots.expiring_prefixes(expiry) for o in self.list_registered(prefix)]

    def delete_registered(self, doomed: Sequence[str]) -> int:
        """Delete root objects capabilities registered (GC: expired caches); returns how many.

        Refuses (InvalidUsageError, nothing deleted) any key of core's own layout: staged
        data, state and leases each have their one deleter. HAZARD: the caller decides the
        objects may go (GC: registered ``expiry="after_grace"`` and older than its grace).
        """
        for key in doomed:
            if not roots.is_registered_root(key):
                raise InvalidUsageError(f"{key!r} is not a registered root object; not deleted", value=key[:300])
        self._m.blob.delete_many(list(doomed))
        return len(doomed)

    # --- dropping the whole shard -------------------------------------------------------

    def drop_closed(self) -> Dropped:
        """Delete every object of the shard layout, the head's version last; the shard must be
        CLOSED (its upper the empty frontier: no append can ever commit again), else
        InvalidUsageError and nothing deleted. Objects outside the layout are left where they
        are and named in :attr:`Dropped.left`.

        Order: staged data, leases and registered root objects first, then rollups, the hint,
        the versions oldest first, and the newest version alone. A crash at any point leaves
        the closed newest version, so the shard is still recognisably one, and a second call
        finishes the job.
        HAZARD: the caller decides that nothing needs the shard any more (no live lease, its
        writers stopped); readers of a dropped shard fail with CorruptionError.
        """
        head = self.head()
        if head.header.upper is not None:
            raise InvalidUsageError(f"{self.url} is not closed (upper {head.header.upper}); only a closed shard "
                                    "is dropped: close it first, so that no writer can commit while it goes")
        objs = self.list_objects()
        first: list[str] = []
        versions: list[tuple[int, str]] = []
        rollups: list[str] = []
        counts: dict[str, int] = dict.fromkeys(DROP_KINDS, 0)
        part_bytes = 0
        for o in objs:
            kind = drop_kind(o.key)
            if kind is None:
                continue
            counts[kind] += 1
            if kind == "version":
                versions.append((keys.version_seqno(o.key) or 0, o.key))
            elif kind == "rollup":
                rollups.append(o.key)
            elif kind != "hint":
                first.append(o.key)
                part_bytes += o.size if kind == "part" else 0
        self._m.blob.delete_many(first)
        self._m.blob.delete_many(rollups)
        if counts["hint"]:
            self._m.blob.delete_many([keys.LATEST])
        ordered = [k for _, k in sorted(versions)]
        below = ordered[:-1]  # the newest alone, last: a multi-object delete has no order
        for i in range(0, len(below), 1000):
            self._m.blob.delete_many(below[i:i + 1000])
        self._m.blob.delete_many(ordered[-1:])
        return Dropped(counts, part_bytes, tuple(o.key for o in objs if drop_kind(o.key) is None))


def _part(p: st.PartMeta) -> st.PartMeta:
    if not p.key.startswith(roots.PARTS_PREFIX):
        raise InvalidUsageError(f"{p.key!r} is not a part of the shard layout", value=p.key[:300])
    return p
