"""What each object of a shard is there for: live, retained, in flight or leaked. One classification, pure.

::

    layout = split(listed)                               # one listing of the shard, each key by what it is
    need = unreferenced(layout, live=keys, retained=ids)  # the descriptions whose fate the read must tell
    got = census(layout, read, now=t, grace_s=3600)      # every object in one class, with why

Every answer to "what is leaked" comes from :func:`census`: ``shardsink verify``, ``shardsink
inspect --objects``, GC's dry run and the Shards page, each through
:func:`shardsink.maintenance.census_read.take_census`, which makes the one state read it takes
(:class:`StateRead`: GC's retained range and horizon, the fates of unreferenced descriptions).

The classes of data objects (under ``parts/`` and ``staging/``):

* **live**: the head references it (a part of a batch of the newest version).
* **retained** ("awaiting GC"): only older retained state versions reference it. Its description's
  batch was removed (compacted away, say) by version ``until + 1`` while versions up to ``until``
  are still retained, so a reader pinned to one of them may still read it. GC deletes it once its
  horizon passes ``until`` and the object is older than the grace period; its :class:`Release`
  says from when, or what that waits for. HAZARD: never delete one by hand.
* **in flight**: nothing references it, but its writer may still commit or delete it: its
  description may still commit (fate ``still_possible``, whatever its age), or it is younger
  than the grace period (GC never takes those). Nothing to do.
* **leaked**: nothing references it, no fate keeps it, and it is older than the grace period.

State objects nothing can read any more are leaked whatever their age (GC deletes them once older
than its grace period): state versions and rollups below the retained chain (an interrupted GC
leaves them), lease objects expired past the clock-skew margin, and objects outside the shard
layout (nothing of shardsink reads or deletes those). The retained versions and their rollups, the
hint, live leases and the root objects capabilities registered are the shard's state: not counted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardsink.core import keys, roots
from shardsink.core.objects import StagedObject, StateObjects, staged_desc_id
from shardsink.storage.base import ObjectInfo

ObjectClass = Literal["live", "retained", "in_flight", "leaked"]
#: The classes, in the order every reader shows them, with the words they are shown by.
LABELS: dict[ObjectClass, str] = {"live": "live", "retained": "awaiting GC", "in_flight": "in flight",
                                  "leaked": "leaked"}
#: What the read says of a description's unreferenced objects (:func:`shardsink.maintenance.leftovers.classify`).
FateName = Literal["committed", "cannot_commit", "still_possible", "unknown", "compaction", "undecided"]
#: A path segment Spark's file output committer writes task attempts under.
SPARK_TEMPORARY = "/_temporary/"


def temporary(key: str) -> bool:
    """Whether ``key`` is under a Spark ``_temporary/`` folder: a task attempt's output before its job committed."""
    return SPARK_TEMPORARY in f"/{key}"


@dataclass(frozen=True)
class Layout:
    """One listing of a shard's root, each object by what it is (:func:`split`)."""

    parts: tuple[StagedObject, ...]
    manifests: tuple[StagedObject, ...]
    state: StateObjects
    leases: tuple[ObjectInfo, ...]
    #: Objects under no core folder and no registered root object.
    unknown: tuple[ObjectInfo, ...]


def split(objects: Iterable[ObjectInfo]) -> Layout:
    """``objects`` (one listing of the shard root) by what each key is; registered root objects,
    the hint and other state keys are left out (they are state, not counted)."""
    parts: list[StagedObject] = []
    manifests: list[StagedObject] = []
    leases: list[ObjectInfo] = []
    unknown: list[ObjectInfo] = []
    versions: dict[int, ObjectInfo] = {}
    rollups: dict[int, ObjectInfo] = {}
    for o in objects:
        if o.key.startswith(roots.PARTS_PREFIX):
            parts.append(StagedObject(o, staged_desc_id(o.key), "part"))
        elif o.key.startswith(roots.STAGING_PREFIX):
            manifests.append(StagedObject(o, staged_desc_id(o.key), "manifest"))
        elif (s := keys.version_seqno(o.key)) is not None:
            versions[s] = o
        elif (s := keys.rollup_seqno(o.key)) is not None:
            rollups[s] = o
        elif o.key.startswith(roots.LEASES_PREFIX):
            leases.append(o)
        elif not roots.known(o.key):
            unknown.append(o)
    return Layout(tuple(parts), tuple(manifests), StateObjects(versions, rollups), tuple(leases), tuple(unknown))


@dataclass(frozen=True)
class Release:
    """When GC may delete what only the retained versions up to ``until`` reference: once GC's
    horizon passes ``until`` (:func:`shardsink.maintenance.gc_horizon.releases`)."""

    until: int
    #: Epoch seconds from which GC's horizon passes ``until`` if nothing else changes (None: time
    #: alone never gets it there; :attr:`waits` says what does).
    at: float | None
    waits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fated:
    """A description's fate as the census reads it, and why (``note``, for people)."""

    fate: FateName
    note: str


@dataclass(frozen=True)
class StateRead:
    """What :func:`census` needs of one read of the shard's state, made AFTER its listing (an
    object committed in between is then referenced, not taken for unreferenced)."""

    head: int
    #: The oldest state version of the retained chain (GC's ``oldest_present``).
    oldest: int
    #: The part keys of the head's batches.
    live: frozenset[str]
    #: Description id -> when GC may take its parts: its batch was removed inside the retained history.
    retained: Mapping[str, Release]
    #: Description id -> its fate, for every description :func:`unreferenced` names.
    fates: Mapping[str, Fated]
    #: Lease keys expired past the clock-skew margin.
    expired_leases: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Classified:
    """One object and its class. ``kind``: part, manifest, version, rollup, lease or unknown.
    Retained ones carry ``until`` (the newest version referencing them) and ``gc_after`` (epoch
    seconds from which GC may delete them; None: not by time alone, ``why`` says what it waits for)."""

    key: str
    kind: str
    cls: ObjectClass
    bytes: int
    age_s: float
    why: str
    until: int | None = None
    gc_after: float | None = None


@dataclass(frozen=True)
class Tally:
    count: int = 0
    bytes: int = 0

    def plus(self, size: int) -> Tally:
        return Tally(self.count + 1, self.bytes + size)


@dataclass(frozen=True)
class Census:
    """Every object of a shard in one class (module docstring), as judged at ``now``."""

    now: float
    grace_s: float
    head: int
    tallies: Mapping[ObjectClass, Tally]
    #: Every object but the live ones (which may be many): by class, then key.
    objects: tuple[Classified, ...]

    def of(self, cls: ObjectClass) -> tuple[Classified, ...]:
        return tuple(o for o in self.objects if o.cls == cls)

    def counts(self) -> dict[str, dict[str, Any]]:
        """``{class: {"count", "bytes", "label"}}`` for every class, in :data:`LABELS` order."""
        return {c: {"count": self.tallies[c].count, "bytes": self.tallies[c].bytes, "label": LABELS[c]}
                for c in LABELS}

    def to_dict(self, *, listed: bool = True) -> dict[str, Any]:
        """JSON-able: the clock, grace period, head and :meth:`counts`; with ``listed``, every
        object but the live ones (``objects``, each with ``gc_after_time`` in ISO-8601 UTC)."""
        out: dict[str, Any] = {"now": self.now, "grace_s": self.grace_s, "head": self.head, "counts": self.counts()}
        if listed:
            out["objects"] = [{**asdict(o), "age_s": round(o.age_s, 1), "gc_after_time": iso(o.gc_after)}
                              for o in self.objects]
        return out

    def render(self) -> str:
        """For people: ``13 live (1,234 bytes), 11 awaiting GC (…), 0 in flight (0 bytes), 0 leaked (0 bytes)``."""
        return ", ".join(f"{self.tallies[c].count:,} {label} ({self.tallies[c].bytes:,} bytes)"
                         for c, label in LABELS.items())


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC to the second (None stays None)."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _referenced(o: StagedObject, live: Collection[str], retained: Collection[str]) -> bool:
    """Whether a retained version references (or may reference) ``o``: a part of the head's batches,
    or under a description whose batch was removed inside the retained history."""
    return o.kind == "part" and (o.key in live or (o.desc_id is not None and o.desc_id in retained))


def unreferenced(layout: Layout, *, live: Collection[str], retained: Collection[str]
                 ) -> dict[str, tuple[list[StagedObject], list[StagedObject]]]:
    """Description id -> its parts no retained version references and its manifests: those whose
    fate :attr:`StateRead.fates` must tell. Objects under no description id are left out."""
    out: dict[str, tuple[list[StagedObject], list[StagedObject]]] = {}
    for o in (*layout.parts, *layout.manifests):
        if o.desc_id is None or _referenced(o, live, retained):
            continue
        parts, manifests = out.setdefault(o.desc_id, ([], []))
        (parts if o.kind == "part" else manifests).append(o)
    return out


def in_flight(desc_id: str | None, fated: Fated | None, *, key: str, age_s: float, grace_s: float) -> str | None:
    """Why an unreferenced staged object ``key`` (of ``desc_id``, whose fate is ``fated``) is in
    flight, or None: it is leaked (module docstring)."""
    if fated is not None and fated.fate == "still_possible":
        return f"description {desc_id} may still commit ({fated.note})"
    if age_s >= grace_s:
        return None
    young = f"younger than the grace period ({grace_s:g} s)"
    if temporary(key):
        return f"a Spark task attempt's output (_temporary/), {young}"
    if fated is not None and fated.fate == "compaction":
        return f"compaction {desc_id}'s output, {young}"
    if fated is not None and fated.fate == "undecided":
        return f"description {desc_id}'s lower is not known yet ({fated.note}), {young}"
    return f"{young}: its writer may still be committing or deleting it"


def _leaked_why(desc_id: str | None, fated: Fated | None) -> str:
    if desc_id is None:
        return "not under a description's folder: GC leaves it alone; look at it, then delete it by hand"
    if fated is None or fated.fate == "undecided":
        note = fated.note if fated is not None else "its fate was not read"
        return f"description {desc_id}: {note}; GC cannot decide it: look at it, then delete it by hand"
    if fated.fate == "compaction":
        return f"compaction {desc_id}'s output, never committed: `shardsink compact` (its sweep) deletes it"
    return f"description {desc_id}: {fated.note}; `shardsink gc` deletes it (`shardsink gc --desc {desc_id}` at once)"


def _retained_why(r: Release, gc_after: float | None, now: float) -> str:
    held = f"only state versions up to {r.until} reference it (a reader pinned to one may read it)"
    if gc_after is None:
        return f"{held}; GC may delete it once they leave the retained history, which waits for: {'; '.join(r.waits)}"
    if gc_after <= now:
        return f"{held}; they are past GC's horizon: the next `shardsink gc` deletes it"
    return f"{held}; GC may delete it from {iso(gc_after)} (they leave the retained history then)"


_STALE = {
    "version": "a state version below the retained chain (an interrupted GC's): `shardsink gc` deletes it",
    "rollup": "a rollup below the oldest retained version: `shardsink gc` deletes it",
    "lease": "an expired read lease: `shardsink gc` deletes it once expired for longer than the grace period",
    "unknown": "not an object of the shard layout: nothing of shardsink reads or deletes it; delete it by hand "
               "if nobody needs it",
}


def _staged(o: StagedObject, read: StateRead, *, now: float, grace_s: float) -> Classified:
    """The class of an unreferenced or retained staged object ``o``."""
    age = max(0.0, now - o.modified)
    d = o.desc_id
    release = read.retained.get(d) if d is not None and o.kind == "part" else None
    if release is not None:
        after = None if release.at is None else max(release.at, o.modified + grace_s)
        return Classified(o.key, o.kind, "retained", o.size, age, _retained_why(release, after, now),
                          release.until, after)
    fated = read.fates.get(d) if d is not None else None
    why = in_flight(d, fated, key=o.key, age_s=age, grace_s=grace_s)
    if why is not None:
        return Classified(o.key, o.kind, "in_flight", o.size, age, why)
    return Classified(o.key, o.kind, "leaked", o.size, age, _leaked_why(d, fated))


def census(layout: Layout, read: StateRead, *, now: float, grace_s: float) -> Census:
    """Every object of ``layout`` in one class (module docstring), judged at ``now`` (epoch
    seconds) with GC's grace period ``grace_s``. Pure: ``read`` holds everything it needs."""
    tallies: dict[ObjectClass, Tally] = dict.fromkeys(LABELS, Tally())
    out: list[Classified] = []
    for o in (*layout.parts, *layout.manifests):
        if o.kind == "part" and o.key in read.live:
            tallies["live"] = tallies["live"].plus(o.size)
            continue
        out.append(_staged(o, read, now=now, grace_s=grace_s))
    stale = [(o, "version") for s, o in layout.state.versions.items() if s < read.oldest]
    stale += [(o, "rollup") for s, o in layout.state.rollups.items() if s < read.oldest]
    stale += [(o, "lease") for o in layout.leases if o.key in read.expired_leases]
    stale += [(o, "unknown") for o in layout.unknown]
    out += [Classified(o.key, kind, "leaked", o.size, max(0.0, now - o.modified), _STALE[kind]) for o, kind in stale]
    for x in out:
        tallies[x.cls] = tallies[x.cls].plus(x.bytes)
    order = list(LABELS)
    out.sort(key=lambda x: (order.index(x.cls), x.key))
    return Census(now, grace_s, read.head, tallies, tuple(out))
