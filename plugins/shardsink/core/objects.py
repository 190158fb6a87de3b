"""The objects of a shard's layout as maintenance sees them: typed listings and what each key is.

Values and pure classifiers only (no store access): :class:`shardsink.core.admin.AdminHandle`
lists and deletes, these describe what it returns. Which key is what is decided here and in
:mod:`shardsink.core.keys`, never above core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardsink.core import keys, roots
from shardsink.storage.base import ObjectInfo


@dataclass(frozen=True)
class StateObjects:
    """The state objects listed under ``state/``: seqno -> object, versions and rollups.

    Objects under ``state/`` with any other name (the hint, strays) are not in either map."""

    versions: dict[int, ObjectInfo]
    rollups: dict[int, ObjectInfo]


@dataclass(frozen=True)
class StagedObject:
    """One object under ``parts/`` (``kind="part"``) or ``staging/`` (``"manifest"``) and the
    description (or compaction) id that owns it; None when the key is not
    ``<prefix><id>/<name>`` (then nothing may decide about it: leave it alone)."""

    info: ObjectInfo
    desc_id: str | None
    kind: Literal["part", "manifest"]

    @property
    def key(self) -> str:
        return self.info.key

    @property
    def size(self) -> int:
        return self.info.size

    @property
    def modified(self) -> float:
        return self.info.modified


def staged_desc_id(key: str) -> str | None:
    """The id owning staged object ``key`` (``parts/<id>/…`` or ``staging/<id>/…``), else None."""
    if not key.startswith((roots.PARTS_PREFIX, roots.STAGING_PREFIX)):
        return None
    segs = key.split("/")
    return segs[1] if len(segs) >= 3 and segs[1] else None


def is_manifest(key: str) -> bool:
    """Whether ``key`` is under ``staging/`` (a manifest), as opposed to a part."""
    return key.startswith(roots.STAGING_PREFIX)


#: What :meth:`shardsink.core.admin.AdminHandle.drop_closed` counts, in the order it reports them.
DROP_KINDS = ("version", "rollup", "hint", "part", "manifest", "lease", "root object")


@dataclass(frozen=True)
class Dropped:
    """What :meth:`shardsink.core.admin.AdminHandle.drop_closed` deleted, by kind (:data:`DROP_KINDS`), and the
    objects under the root it left because they are not of the shard layout."""

    counts: dict[str, int]
    part_bytes: int
    left: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def drop_kind(key: str) -> str | None:
    """The kind of layout object ``key`` is (:data:`DROP_KINDS`), None outside the layout."""
    if key == keys.LATEST:
        return "hint"
    if keys.version_seqno(key) is not None:
        return "version"
    if keys.rollup_seqno(key) is not None:
        return "rollup"
    if staged_desc_id(key) is not None:
        return "manifest" if is_manifest(key) else "part"
    if key.startswith(roots.LEASES_PREFIX):
        return "lease"
    if roots.is_registered_root(key):
        return "root object"
    return None
