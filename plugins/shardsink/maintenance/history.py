"""Reading a shard's retained history as maintenance sees it (GC and verify share this).

The retained state versions are the contiguous range ``[oldest, head]`` (GC deletes
oldest first). The batch list at any retained version is computed from the newest
rollup object at or below it whose later diffs are all present: after GC, the oldest
retained version carries a rollup at itself (``AdminHandle.anchor``), and any rollup object
is by construction the exact batch list at its seqno.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsink.core import state as st
from shardsink.core.admin import AdminHandle, staged_desc_id
from shardsink.errors import CorruptionError
from shardsink.storage.base import ObjectInfo


@dataclass(frozen=True)
class Listing:
    """The state objects present: seqno -> object (versions and rollups)."""

    versions: dict[int, ObjectInfo]
    rollups: dict[int, ObjectInfo]

    @property
    def oldest(self) -> int | None:
        return min(self.versions, default=None)

    def gaps(self, head: int) -> list[int]:
        """Seqnos missing between the oldest listed version and ``head``."""
        lo = self.oldest
        if lo is None:
            return []
        return [s for s in range(lo, head + 1) if s not in self.versions]


def list_state(admin: AdminHandle) -> Listing:
    """One listing of the state objects (:meth:`AdminHandle.list_state`)."""
    got = admin.list_state()
    return Listing(got.versions, got.rollups)


def retained_start(admin: AdminHandle, listing: Listing, head: int) -> int:
    """The oldest version of the retained chain ``[start, head]`` (all present).

    Without gaps, the oldest listed version. GC deletes condemned versions with
    multi-object deletes, in which S3 removes keys in no particular order: a failed or
    interrupted one can leave condemned versions below a gap. They lie below the version
    GC anchored first (:meth:`AdminHandle.anchor`: rollup pointer at itself, rollup object
    written), so the chain starts at the oldest anchored version above the highest gap;
    older versions are leftovers for the next GC. CorruptionError if there is none: a
    real hole in the history.
    """
    oldest = listing.oldest
    if oldest is None:
        raise CorruptionError(f"{admin.url}: no state versions listed")
    gaps = listing.gaps(head)
    if not gaps:
        return oldest
    for s in range(max(gaps) + 1, head + 1):
        v = admin.fetch(s)
        if v is None:
            break
        if v.header.rollup == s and s in listing.rollups:
            return s
    raise CorruptionError(
        f"{admin.url}: retained history has gaps ({admin.version_object(gaps[0])} is missing) with no anchored "
        "version above them; refusing to treat it as collectable (run `shardsink verify`)"
    )


def batches_at(admin: AdminHandle, seqno: int, listing: Listing) -> tuple[st.BatchMeta, ...]:
    """The live batches at retained version ``seqno``, from the newest usable rollup.

    Usable: a rollup object ``r <= seqno`` (or the empty list at ``r = 0``) such that
    versions ``r+1 .. seqno`` are all listed. CorruptionError if there is none.
    """
    r = seqno
    while r > 0 and r not in listing.rollups:
        if r not in listing.versions:
            break
        r -= 1
    if r > 0 and r not in listing.rollups:
        raise CorruptionError(
            f"{admin.url}: no rollup at or below version {seqno} with a complete chain after it "
            f"(version {admin.version_object(r)} is missing and no rollup covers it)"
        )
    return admin.batches_from(r, seqno)


@dataclass(frozen=True)
class Referenced:
    """Every part and batch any retained version ``[oldest, head]`` references."""

    parts: dict[str, tuple[st.PartMeta, int]]  # key -> (meta, a version referencing it)
    lowers: dict[str, int]  # desc id -> lower of its batch (from any retained version)
    keys: dict[str, frozenset[str]]  # desc id -> its batch's part keys


def referenced(admin: AdminHandle, oldest: int, head: int, listing: Listing) -> Referenced:
    """Union over versions ``oldest..head``: the batches at ``oldest`` plus every batch added after."""
    parts: dict[str, tuple[st.PartMeta, int]] = {}
    lowers: dict[str, int] = {}
    keys: dict[str, frozenset[str]] = {}

    def add(b: st.BatchMeta, seqno: int) -> None:
        lowers.setdefault(b.desc_id, b.lower)
        keys.setdefault(b.desc_id, frozenset(p.key for p in b.parts))
        for p in b.parts:
            parts.setdefault(p.key, (p, seqno))

    for b in batches_at(admin, oldest, listing):
        add(b, oldest)
    for v in admin.fetch_many(range(oldest + 1, head + 1)):
        for b in v.added:
            add(b, v.seqno)
    return Referenced(parts, lowers, keys)


@dataclass(frozen=True)
class Removals:
    """What the removal chain (:attr:`Header.removal`) says about a stretch of history."""

    at: dict[str, int]  # desc id -> the version in ``(above, head]`` that removed its batch
    lowers: dict[str, int]  # desc id -> lower, for every removal walked (down to ``down_to``)

    @property
    def ids(self) -> frozenset[str]:
        """The batches removed by versions in ``(above, head]``."""
        return frozenset(self.at)


def removals(admin: AdminHandle, head: st.Version, *, above: int, down_to: int | None = None) -> Removals | None:
    """Walk the removal chain from ``head``: the batches removed by versions in ``(above, head]``
    (and the lowers of those removed in ``(down_to, head]``, for fate checks), reading one
    version per removal (compactions), not every version. None if the chain is unknown
    inside ``(above, head]`` (versions written before the field existed): read the history.
    """
    floor = above if down_to is None else min(above, down_to)
    at: dict[str, int] = {}
    lowers: dict[str, int] = {}
    last = head.seqno
    r = head.header.removal
    while r is not None and r > floor:
        v = admin.fetch(r)
        if v is None:
            if r > above:
                raise CorruptionError(
                    f"{admin.url}/{admin.version_object(r)} (a removal inside the retained history) is missing")
            break  # already collected: nothing older is needed
        if r > above:
            at.update(dict.fromkeys(v.removed, r))
        if len(v.removed_lowers) == len(v.removed):
            lowers.update(zip(v.removed, v.removed_lowers, strict=True))
        last, r = r, v.header.prior_removal
    if r is None and last > above:
        return None
    return Removals(at, lowers)


def removed_after(admin: AdminHandle, head: st.Version, *, above: int) -> dict[str, int]:
    """Description id -> the version ``r`` in ``(above, head]`` that removed its batch: versions
    ``above .. r - 1`` still reference its parts, the head does not. From the removal chain
    (:func:`removals`: one version read per removal), else from every version in that range
    (shards written before the chain existed). CorruptionError if a removal in it is missing."""
    chain = removals(admin, head, above=above)
    if chain is not None:
        return dict(chain.at)
    return {d: v.seqno for v in admin.fetch_many(range(above + 1, head.seqno + 1)) for d in v.removed}


@dataclass(frozen=True)
class Protected:
    """What GC must not delete: exact part keys of known batches, and whole descriptions
    whose batch was removed inside the retained history (their keys are not read)."""

    keys: dict[str, frozenset[str]]  # desc id -> its batch's part keys
    descs: frozenset[str]
    lowers: dict[str, int]  # desc id -> lower of its batch

    def covers(self, key: str) -> bool:
        d = staged_desc_id(key) or ""
        return d in self.descs or key in self.keys.get(d, frozenset())


def protected(admin: AdminHandle, oldest: int, head: st.Version, listing: Listing) -> Protected:
    """Everything the retained versions ``[oldest, head]`` reference, cheaply when it can be.

    A batch referenced by a retained version ``v`` is live at ``head`` or was removed by a
    version in ``(v, head]``, so: the batches at ``oldest`` and at ``head`` plus every batch
    the removal chain names in ``(oldest, head]``: a rollup and a few diffs, and one
    version per compaction. Without a known chain: every retained version (:func:`referenced`).
    """
    chain = removals(admin, head, above=oldest)
    if chain is None:
        refs = referenced(admin, oldest, head.seqno, listing)
        return Protected(refs.keys, frozenset(), refs.lowers)
    keys: dict[str, frozenset[str]] = {}
    lowers: dict[str, int] = {}
    for b in (*batches_at(admin, oldest, listing), *admin.batches_at(head.header)):
        keys.setdefault(b.desc_id, frozenset(p.key for p in b.parts))
        lowers.setdefault(b.desc_id, b.lower)
    return Protected(keys, chain.ids, lowers)
