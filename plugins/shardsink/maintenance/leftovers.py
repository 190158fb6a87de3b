"""Staged objects no retained version references, by description, with their age and fate.

::

    for d in leftovers(shard):          # every description with unreferenced staged objects
        print(d.desc_id, d.fate, d.parts, d.youngest_s)
    why = d.in_flight(obj, grace_s=3600)   # None: leaked; else why it is in flight

A writer stages ``parts/<desc_id>/…`` and ``staging/<desc_id>/slot-<i>.json`` before its
append commits them. Until then (and for the objects a commit did not take) they are
*leftovers*. This module says, for each description, what its fate allows:

* ``still_possible``: not committed and the shard's upper has not passed its lower: a writer
  may be running, or its append may be retried. Never deletable (the fate primitive refuses);
* ``committed`` / ``cannot_commit`` / ``unknown``: final. Its unreferenced objects are leaked
  once older than the grace period; ``shardsink gc`` takes them then, ``shardsink gc --desc``
  at once (``unknown`` is refused there: check the data by hand first);
* ``compaction``: a compaction's output (decided by the compaction sweep, by its inputs);
* ``undecided``: no retained batch, readable manifest or readable part gives its lower.

Whether an object is **in flight** or leaked is :func:`shardsink.core.census.in_flight`'s to say
(:meth:`Leftover.in_flight` asks it): in flight while its description is ``still_possible``, or
while it is younger than the grace period; every reader of leaks asks the census
(:mod:`shardsink.maintenance.census_read`).

The lower of a description comes from a retained batch, else its manifests, else the
smallest ``_time`` of one readable part: every part's times are at or above the lower, so a
proxy lower never turns ``still_possible`` into a final fate (the same rule GC uses).
Reads only; fates are read with :meth:`shardsink.core.admin.AdminHandle.fate` (fresh reads),
and only where the head cannot settle them (:func:`classify`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardsink.core import census as cs
from shardsink.core import fate as ft
from shardsink.core.admin import AdminHandle, StagedObject
from shardsink.core.census import SPARK_TEMPORARY, FateName
from shardsink.core.shard import Shard
from shardsink.maintenance.gc_staged import left_alone, manifest_lower, min_time
from shardsink.maintenance.history import list_state, protected, retained_start

__all__ = ["SPARK_TEMPORARY", "FateName", "Leftover", "StagedLeftover", "by_description", "classify",
           "description_lower", "leftovers"]


@dataclass(frozen=True)
class StagedLeftover:
    """One unreferenced staged object: ``kind`` part (under ``parts/``) or manifest."""

    key: str
    kind: Literal["part", "manifest"]
    bytes: int
    age_s: float

    @property
    def temporary(self) -> bool:
        """Under a Spark ``_temporary/`` folder: a task attempt's output before its job committed."""
        return cs.temporary(self.key)


@dataclass(frozen=True)
class Leftover:
    """One description's unreferenced staged objects and what its fate says about them."""

    desc_id: str
    lower: int | None
    fate: FateName
    #: Why, for people: e.g. ``shard upper 30 = its lower 30, from its manifests``.
    note: str
    objects: tuple[StagedLeftover, ...]

    @property
    def parts(self) -> int:
        return sum(1 for o in self.objects if o.kind == "part")

    @property
    def part_bytes(self) -> int:
        return sum(o.bytes for o in self.objects if o.kind == "part")

    @property
    def manifests(self) -> int:
        return sum(1 for o in self.objects if o.kind == "manifest")

    @property
    def youngest_s(self) -> float:
        return min((o.age_s for o in self.objects), default=0.0)

    @property
    def oldest_s(self) -> float:
        return max((o.age_s for o in self.objects), default=0.0)

    def in_flight(self, obj: StagedLeftover, *, grace_s: float) -> str | None:
        """Why ``obj`` (one of :attr:`objects`) is in flight, or None: leaked
        (:func:`shardsink.core.census.in_flight`)."""
        return cs.in_flight(self.desc_id, cs.Fated(self.fate, self.note), key=obj.key, age_s=obj.age_s,
                            grace_s=grace_s)

    def to_dict(self) -> dict[str, Any]:
        return {"desc_id": self.desc_id, "lower": self.lower, "fate": self.fate, "note": self.note,
                "parts": self.parts, "part_bytes": self.part_bytes, "manifests": self.manifests,
                "youngest_s": round(self.youngest_s, 1), "oldest_s": round(self.oldest_s, 1),
                "objects": [{**asdict(o), "age_s": round(o.age_s, 1), "temporary": o.temporary}
                            for o in self.objects]}


def description_lower(admin: AdminHandle, parts: list[StagedObject], manifests: list[StagedObject],
                      known: int | None = None) -> tuple[int | None, str]:
    """A description's lower and where it came from: ``known`` (a retained batch's), else the
    lower its manifests agree on, else the smallest ``_time`` of its first readable part (a
    proxy at or above the lower). (None, why) if nothing tells."""
    if known is not None:
        return known, "its batch"
    got = manifest_lower(admin, manifests)
    if got is not None:
        return got, "its manifests"
    for o in parts:
        if o.key.endswith(".parquet") and SPARK_TEMPORARY not in f"/{o.key}":
            t = min_time(admin, [o])
            if t is not None:
                return t, f"the first _time of {o.key}"
    return None, "no retained batch, readable manifest or readable part names it"


def classify(admin: AdminHandle, desc_id: str, parts: list[StagedObject], manifests: list[StagedObject], *,
             head_upper: int | None, now: float, known_lower: int | None = None, precise: bool = True) -> Leftover:
    """The :class:`Leftover` of one description's unreferenced ``parts`` and ``manifests``.

    ``head_upper``: the shard's upper at a head read made AFTER the objects were listed. With
    ``precise=False`` the fate is read only where it may be ``still_possible`` (the head's
    upper at or below the lower): a final fate is then named ``cannot_commit`` without telling
    committed, cannot-commit and unknown apart (verify needs only in flight or not).
    """
    objs = tuple(sorted((StagedLeftover(o.key, o.kind, o.size, max(0.0, now - o.modified)) for o in
                         (*parts, *manifests)), key=lambda o: o.key))
    if admin.is_compaction(desc_id):
        return Leftover(desc_id, None, "compaction", "a compaction's output, decided by the compaction sweep", objs)
    alone = left_alone(admin, manifests)
    if alone is not None:
        return Leftover(desc_id, None, "undecided", alone, objs)
    lower, where = description_lower(admin, parts, manifests, known_lower)
    if lower is None:
        return Leftover(desc_id, None, "undecided", where, objs)
    if not precise and (head_upper is None or head_upper > lower):
        return Leftover(desc_id, lower, "cannot_commit", f"shard upper {head_upper} is past its lower, from {where}",
                        objs)
    fate = admin.fate(desc_id, lower)
    return Leftover(desc_id, lower, *_fate_words(fate, lower, where), objs)


def _fate_words(fate: ft.Fate, lower: int, where: str) -> tuple[FateName, str]:
    if isinstance(fate, ft.Committed):
        return "committed", f"committed at seqno {fate.seqno}; these objects are not in its batch"
    if isinstance(fate, ft.CannotCommit):
        return "cannot_commit", f"shard upper {fate.upper} is past its lower {lower}, from {where}"
    if isinstance(fate, ft.Unknown):
        return "unknown", (f"its evidence is older than the retained history (oldest version {fate.oldest}); "
                           "check the data before re-sending its rows")
    return "still_possible", f"shard upper {fate.upper} = its lower {lower}, from {where}"


def by_description(objs: Iterable[StagedObject]) -> tuple[dict[str, list[StagedObject]], list[StagedObject]]:
    """Staged objects grouped by the id owning them, and those under no id (left alone)."""
    groups: dict[str, list[StagedObject]] = defaultdict(list)
    stray: list[StagedObject] = []
    for o in objs:
        if o.desc_id is None:
            stray.append(o)
        else:
            groups[o.desc_id].append(o)
    return groups, stray


def leftovers(shard: Shard, *, desc_id: str | None = None, now: float | None = None) -> list[Leftover]:
    """Every description with staged objects no retained version references, oldest
    description first by its youngest object; ``desc_id`` restricts it to one description.

    Lists ``parts/`` and ``staging/`` FIRST, then reads the head and what the retained
    versions reference (an object committed in between is then referenced, not listed as
    a leftover). Each description's fate is read once (:func:`classify`, precise).
    """
    admin = shard.admin()
    t = time.time() if now is None else now
    parts = admin.list_parts()
    manifests = admin.list_manifests()
    head = admin.head()
    listing = list_state(admin)
    refs = protected(admin, retained_start(admin, listing, head.seqno), head, listing)
    loose = [o for o in parts if not refs.covers(o.key)]
    pg, _ = by_description(loose)
    mg, _ = by_description(manifests)
    wanted = sorted(set(pg) | set(mg)) if desc_id is None else [d for d in (desc_id,) if d in pg or d in mg]
    out = [classify(admin, d, pg.get(d, []), mg.get(d, []), head_upper=head.header.upper, now=t,
                    known_lower=refs.lowers.get(d)) for d in wanted]
    return sorted(out, key=lambda x: (-x.youngest_s, x.desc_id))
