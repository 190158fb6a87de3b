"""The invariants checked after every step: an observer of every write the store performs.

:class:`Checker` watches the shard's objects as they change (:class:`shardsink_dev.sim.store.Event`)
and keeps its own account, decoded from the raw JSON with :mod:`json` (never the library's codec,
so a bug in the library's reading cannot hide one in its writing):

* **versions**: each created ``state/v/<n>`` is ``n = previous + 1`` (no gap, never a fork); its
  upper never moves back (a closed shard's is the largest); its since never moves back and never
  passes its upper; an append's lower is the previous upper and its description was never
  committed before (exactly once); a compaction removes only live batches and keeps the upper. A
  rewritten version (GC's anchor) keeps its header's upper and since;
* **parts**: a deleted part is referenced by no version still in the store (every part a live
  version references exists); a deleted part or manifest of a description that may still commit
  (its own account of the fate: not committed and the upper not past its lower; a compaction
  not applied with every input live) is a violation, unless the actor that wrote it deletes it
  before any manifest or version named it (an unpublished part: the fate primitive's
  ``unpublished``, a failed compaction's abandon).

A broken invariant raises :class:`shardsink_dev.sim.sched.Violation` in the actor that made the
write, at that step. The account also serves the end-of-schedule checks
(:mod:`shardsink_dev.sim.final`): which descriptions committed, the live batches, the head.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from shardsink_dev.sim.sched import Scheduler, Violation
from shardsink_dev.sim.store import Event, World

_VERSION = re.compile(r"^state/v/(\d{20})\.json$")
_STAGED = re.compile(r"^(parts|staging)/([^/]+)/(.+)$")
#: An upper that sorts above every time: a closed shard's (None).
CLOSED = 2**63


def upper_of(u: int | None) -> int:
    return CLOSED if u is None else u


@dataclass
class Compaction:
    """A compaction as its manifest names it: its lower and input batch ids."""

    lower: int
    inputs: tuple[str, ...]


@dataclass
class Checker:
    """The observer (see the module docstring). ``prefix``: the shard's key prefix in ``bucket``."""

    world: World
    sched: Scheduler
    bucket: str
    prefix: str
    uppers: dict[int, int] = field(default_factory=dict)  # seqno -> upper (CLOSED: closed)
    sinces: dict[int, int] = field(default_factory=dict)
    head: int = -1
    committed: dict[str, int] = field(default_factory=dict)  # desc or compaction id -> seqno
    live: dict[str, tuple[str, ...]] = field(default_factory=dict)  # batch id -> part keys
    part_span: dict[str, list[int]] = field(default_factory=dict)  # part key -> [added at, removed at]
    lowers: dict[str, int] = field(default_factory=dict)  # description id -> lower (the world registers)
    compactions: dict[str, Compaction] = field(default_factory=dict)
    creators: dict[str, str] = field(default_factory=dict)  # staged key -> the actor that wrote it
    published: set[str] = field(default_factory=set)  # part keys a manifest or version named
    events: int = 0

    def __post_init__(self) -> None:
        self.world.observers.append(self.observe)

    # --- the observer -------------------------------------------------------------------------

    def observe(self, ev: Event) -> None:
        if ev.bucket != self.bucket or not ev.key.startswith(self.prefix + "/"):
            return
        self.events += 1
        key = ev.key[len(self.prefix) + 1:]
        m = _VERSION.match(key)
        if m is not None:
            self._version(int(m.group(1)), ev)
            return
        s = _STAGED.match(key)
        if s is not None:
            self._staged(key, s.group(1), s.group(2), s.group(3), ev)

    def _fail(self, kind: str, message: str) -> Violation:
        return self.sched.fail(Violation(kind, message))

    def _version(self, seqno: int, ev: Event) -> None:
        if ev.after is None:
            return  # GC deleting history: checked where parts go
        doc = json.loads(ev.after.data)
        h = doc["header"]
        up, since = upper_of(h["upper"]), h["since"]
        if ev.before is not None:  # GC's anchor rewrites a version's rollup pointer only
            if (self.uppers.get(seqno), self.sinces.get(seqno)) not in ((up, since), (None, None)):
                raise self._fail("anchor-changed-header", f"version {seqno} was rewritten with upper {h['upper']} "
                                                          f"since {since}")
            return
        if seqno != self.head + 1:
            raise self._fail("seqno-gap", f"version {seqno} created after version {self.head}")
        if self.head >= 0:
            self._successor(seqno, doc, up, since)
        if since > up:
            raise self._fail("since-past-upper", f"version {seqno}: since {since} > upper {h['upper']}")
        self.uppers[seqno], self.sinces[seqno], self.head = up, since, seqno
        self._batches(seqno, doc)

    def _successor(self, seqno: int, doc: dict[str, Any], up: int, since: int) -> None:
        prev_up, prev_since = self.uppers[seqno - 1], self.sinces[seqno - 1]
        if up < prev_up:
            raise self._fail("upper-moved-back", f"version {seqno}: upper {up} < {prev_up}")
        if since < prev_since:
            raise self._fail("since-moved-back", f"version {seqno}: since {since} < {prev_since}")
        c = doc["commit"]
        if c["kind"] in ("append", "close"):
            if c["lower"] != prev_up:
                raise self._fail("append-not-at-upper", f"version {seqno}: lower {c['lower']} != upper {prev_up}")
            if c["desc_id"] in self.committed:
                raise self._fail("committed-twice", f"description {c['desc_id']} committed at "
                                                    f"{self.committed[c['desc_id']]} and again at {seqno}")
            self.committed[c["desc_id"]] = seqno
        elif c["kind"] == "compact":
            if up != prev_up:
                raise self._fail("compaction-moved-upper", f"version {seqno}")
            gone = [b for b in doc["removed"] if b not in self.live]
            if gone:
                raise self._fail("compaction-of-dead-batch", f"version {seqno} removed {gone}, not live")
            self.committed[c["compaction_id"]] = seqno

    def _batches(self, seqno: int, doc: dict[str, Any]) -> None:
        for b in doc["removed"]:
            for k in self.live.pop(b, ()):
                self.part_span[k][1] = seqno
        for b in doc["added"]:
            keys = tuple(p["key"] for p in b["parts"])
            self.live[b["desc_id"]] = keys
            for k in keys:
                self.part_span[k] = [seqno, CLOSED]
                self.published.add(k)

    # --- staged objects -----------------------------------------------------------------------

    def _staged(self, key: str, folder: str, owner: str, rest: str, ev: Event) -> None:
        actor = self.sched.current.name if self.sched.current is not None else "world"
        if ev.after is not None:
            self.creators.setdefault(key, actor)
            if folder == "staging" and ev.after is not None:
                self._manifest(owner, rest, ev.after.data)
            return
        if folder == "parts":
            self._part_deleted(key)
        if self._still_possible(owner) and not (self.creators.get(key) == actor and key not in self.published):
            raise self._fail("still-possible-deleted", f"{key} deleted by {actor} while {owner} may still commit")

    def _manifest(self, owner: str, rest: str, data: bytes) -> None:
        doc = json.loads(data)
        if rest == "compaction.json":
            batches = doc.get("inputs") or doc.get("batches") or []
            self.compactions[owner] = Compaction(batches[0]["lower"] if batches else 0,
                                                 tuple(b["desc_id"] for b in batches))
        else:
            self.published.update(p["key"] for p in doc.get("parts", ()))

    def _part_deleted(self, key: str) -> None:
        span = self.part_span.get(key)
        if span is None:
            return
        objs = self.world.objects(self.bucket)
        present = [s for s in range(span[0], min(span[1], self.head + 1))
                   if f"{self.prefix}/state/v/{s:020d}.json" in objs]
        if present:
            raise self._fail("referenced-part-deleted", f"{key} deleted while versions {present[:5]} reference it")

    def _still_possible(self, owner: str) -> bool:
        """Our own account of the fate: may ``owner`` (a description or compaction id) still commit?"""
        if owner in self.committed:
            return False
        if owner in self.compactions:
            c = self.compactions[owner]
            return bool(c.inputs) and all(b in self.live for b in c.inputs)
        lower = self.lowers.get(owner)
        return lower is not None and self.head >= 0 and self.uppers[self.head] <= lower
