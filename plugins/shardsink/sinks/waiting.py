"""Staged descriptions, as the manifests under ``staging/`` tell: who an ahead-minted append waits
behind, and the band of descriptions staged ahead of the shard's upper.

::

    staged = staged_descriptions(shard)            # every ingest description with a manifest
    behind = at_upper(staged, upper)               # the one(s) whose lower is the upper: next in line
    waits_behind(shard, upper, dag_id=d)           # the same, as one line naming their DAG runs
    band = ahead_of(staged, upper)                 # lower > upper: staged, waiting for their turn
    waiting_json(shard, upper)                     # lower >= upper, as JSON (inspect, the Shards page)

A backfill mints each interval's description as soon as the source covers it, its writes stage
at once, and its append waits until the shard's upper reaches its lower
(:func:`shardsink.sinks.append.append_run`). These reads say what the wait is for: the
description starting at the upper (and the DAG run owning it, which its id names), or none
(its run has not minted or staged yet, or failed before staging).

Reads only (one listing of ``staging/`` and one manifest per description); never a fate: a
description listed here may have committed or lost meanwhile. An unreadable manifest or a
compaction manifest is skipped (the caller reports what it found, never decides a deletion).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardsink.core import manifests as mf
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError
from shardsink.sinks.description import run_of


@dataclass(frozen=True)
class Staged:
    """One ingest description with staged manifests: ``[lower, upper)``, the ``writer`` its manifests
    record, how many of its ``slots`` have a manifest, and the newest manifest's time (epoch s)."""

    desc_id: str
    lower: int
    upper: int
    writer: str
    staged_slots: int
    slots: int
    newest: float

    def line(self, dag_id: str | None = None) -> str:
        """One line for a log, an XCom or ``shardsink inspect``; with ``dag_id``, the DAG run that
        minted it (from its id, :func:`shardsink.sinks.description.run_of`)."""
        run = run_of(self.desc_id, dag_id) if dag_id is not None else None
        return (f"description {self.desc_id} [{self.lower}, {self.upper})"
                f"{f' of DAG run {run!r} ({dag_id})' if run else ''}, {self.staged_slots}/{self.slots} slots staged")


def staged_descriptions(shard: Shard) -> list[Staged]:
    """Every ingest description with at least one readable manifest, by lower (one listing, one
    manifest read per description)."""
    admin = shard.admin()
    groups: dict[str, list[float]] = {}
    first: dict[str, str] = {}
    for o in admin.list_manifests():
        if o.desc_id is None:
            continue
        groups.setdefault(o.desc_id, []).append(o.info.modified)
        first.setdefault(o.desc_id, o.key)
    out: list[Staged] = []
    for d, times in groups.items():
        data = admin.get(first[d])
        if data is None:
            continue
        try:
            head = mf.decode_head(data, where=f"{shard.url}/{first[d]}")
            if head.kind != "ingest":
                continue
            doc = mf.decode_manifest(data, where=f"{shard.url}/{first[d]}")
        except CorruptionError:
            continue
        out.append(Staged(d, doc.lower, doc.upper, doc.writer, len(times), doc.slots, max(times)))
    return sorted(out, key=lambda s: (s.lower, s.desc_id))


def at_upper(staged: Sequence[Staged], upper: int | None) -> list[Staged]:
    """The staged descriptions whose lower is ``upper``: the next in line to commit."""
    return [s for s in staged if upper is not None and s.lower == upper]


def waits_behind(shard: Shard, upper: int, *, dag_id: str | None = None) -> str:
    """Who a description waiting at ``upper`` waits behind: the staged description(s) starting at
    the upper with the DAG run owning each, or what is missing (one listing of ``staging/``)."""
    found = at_upper(staged_descriptions(shard), upper)
    if found:
        return "; ".join(s.line(dag_id) for s in found)
    return (f"no description staged at the shard's upper {upper} (the run owning the interval from {upper} has "
            "not minted or staged yet, or failed before staging)")


def ahead_of(staged: Sequence[Staged], upper: int | None) -> list[Staged]:
    """The staged descriptions whose lower is past ``upper``: waiting for their turn."""
    return [s for s in staged if upper is not None and s.lower > upper]


def waiting_json(shard: Shard, upper: int | None) -> list[dict[str, Any]]:
    """The descriptions staged at or ahead of ``upper`` (by lower), as ``shardsink inspect --json``
    and the Shards page show them: ``desc_id``, ``lower``, ``upper``, ``staged_slots``, ``slots`` and
    ``turn`` (``"next"``: its lower is the upper; ``"waiting"``: behind another). None (a closed
    shard): none. One listing of ``staging/``, one manifest read per description."""
    if upper is None:
        return []
    return [{"desc_id": s.desc_id, "lower": s.lower, "upper": s.upper, "staged_slots": s.staged_slots,
             "slots": s.slots, "turn": "next" if s.lower == upper else "waiting"}
            for s in staged_descriptions(shard) if s.lower >= upper]
