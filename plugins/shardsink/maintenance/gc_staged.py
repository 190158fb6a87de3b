"""What GC learns from a description's staged objects when no retained batch tells: whether
they are GC's to decide at all (:func:`left_alone`), and the description's lower from its
manifests (:func:`manifest_lower`) or, failing that, from its parts (:func:`min_time`).
Reads only; an unreadable object never yields an answer, so its description is kept.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import manifests as mf
from shardsink.core.admin import AdminHandle, StagedObject
from shardsink.core.updates import TIME
from shardsink.errors import CorruptionError

log = logging.getLogger("shardsink.maintenance.gc")


def left_alone(admin: AdminHandle, objs: list[StagedObject]) -> str | None:
    """Why a description's staged objects are not GC's to decide (None: they are): it has a
    compaction manifest, or a manifest this shardsink cannot read (garbage, or a newer
    format whose meaning it does not know: never delete what is not understood)."""
    for o in objs:
        got = admin.get(o.key)
        if got is None:
            continue
        try:
            head = mf.decode_head(got, where=f"{admin.url}/{o.key}")
        except CorruptionError as e:
            return f"{e}; left alone"
        if head.kind == "compaction":
            # Its fate depends on its inputs being live, which only the compaction module
            # decides (``maintenance.compact.sweep``); a pending one may be mid-commit.
            return "has a compaction manifest; left to the compaction sweep"
    return None


def manifest_lower(admin: AdminHandle, objs: list[StagedObject]) -> int | None:
    """The ``lower`` all of a description's manifests agree on (None: none readable, or they disagree)."""
    lowers: set[int | None] = set()
    for o in objs:
        got = admin.get(o.key)
        if got is None:
            continue
        try:
            lowers.add(mf.decode_head(got, where=f"{admin.url}/{o.key}").lower)
        except CorruptionError:
            continue
    lowers.discard(None)
    return lowers.pop() if len(lowers) == 1 else None


def min_time(admin: AdminHandle, objs: list[StagedObject]) -> int | None:
    """The smallest ``_time`` in the parts ``objs`` (each part's times are >= its batch's lower)."""
    best: int | None = None
    for o in objs:
        got = admin.get(o.key)
        if got is None:
            continue
        try:
            col = pq.read_table(pa.BufferReader(got), columns=[TIME], use_threads=False)[TIME]
        except (pa.ArrowException, OSError, KeyError) as e:
            log.warning("gc: part %s is unreadable (%s); its description is kept", o.key, e)
            return None
        if len(col):
            t = pc.min(col).as_py()
            best = t if best is None else min(best, t)
    return best
