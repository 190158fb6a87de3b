"""Bindings between a source's own progress (FromTime: offsets) and shard times (IntoTime).

Pure values and functions; no I/O. The remap shard (:mod:`shardsink.reclock.remap`)
stores them; sources and the ingest hooks interpret them.

Definitions every reclocked component relies on:

* A **frontier** maps each source partition to its *next* offset: offsets ``< F[p]`` are
  covered. For a Kafka topic the partitions are ``"<partition number>"``; for file
  arrivals there is one partition ``"files"`` whose offsets are the order in which files
  were first bound (their **ordinals**).
* A **binding** at shard time ``t`` says: every source record with offset ``< F(t)`` has a
  shard time ``<= t``. ``F(t)`` is the frontier of the newest binding at or before ``t``
  (empty, i.e. all zero, before the first one). Bindings are final and monotonic: a
  later time never maps to an earlier frontier.
* **Stamping**: a record at offset ``o`` of partition ``p`` gets the earliest binding time
  ``t`` with ``o < F(t)[p]``. So a batch description ``[lower, upper)`` of a data shard
  holds exactly the records with ``F(lower - 1)[p] <= o < F(upper - 1)[p]``, each stamped
  with the time of the binding that first covered it; those times lie in ``[lower, upper)``.
* **Resumption**: a data shard with upper ``U`` holds exactly the records below
  ``F(U - 1)``; with several output shards the source resumes from ``F(min U - 1)``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shardsink.errors import CorruptionError, InvalidUsageError

#: The single partition of file-arrival sources.
FILES = "files"

Frontier = Mapping[str, int]


@dataclass(frozen=True)
class BoundFile:
    """A file bound to a shard time: its ordinal (offset), key under the root, size, and
    identity (:class:`shardsink.storage.base.SourceObject`, checked on read with its
    ``matches``; "" if bound before identities were recorded: then only the size is checked)."""

    ordinal: int
    key: str
    size: int
    identity: str = ""


@dataclass(frozen=True)
class Binding:
    """The frontier bound at shard time ``time`` and the files first bound then."""

    time: int
    frontier: Mapping[str, int]
    files: tuple[BoundFile, ...] = ()


@dataclass(frozen=True)
class Span:
    """Offsets ``[start, end)`` of ``partition``, all stamped with shard time ``time``."""

    partition: str
    start: int
    end: int
    time: int


@dataclass(frozen=True)
class Bindings:
    """All bindings of a remap shard below its ``upper`` (times ``< upper`` are final).

    ``since``: bindings at times below it may have been compacted forward and cannot
    be told apart; stamping refuses descriptions that need them.
    """

    upper: int
    since: int
    history: tuple[Binding, ...] = ()
    _times: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        times = tuple(b.time for b in self.history)
        if list(times) != sorted(set(times)):
            raise CorruptionError(f"remap bindings are not one per time in increasing order: {times[:10]}")
        object.__setattr__(self, "_times", times)

    def frontier_at(self, t: int) -> dict[str, int]:
        """``F(t)``: the frontier of the newest binding at or before ``t`` (``{}`` if none).

        Raises InvalidUsageError for ``t >= upper`` (not bound yet) and CorruptionError for
        ``t < since - 1`` when bindings were compacted (the answer would be a guess).
        """
        if t >= self.upper:
            raise InvalidUsageError(f"time {t} is not bound yet: the remap shard's upper is {self.upper}")
        if self.since > 0 and t < self.since:
            raise CorruptionError(
                f"the bindings at times before {self.since} were compacted; time {t} cannot be mapped to offsets")
        i = bisect.bisect_right(self._times, t)
        return dict(self.history[i - 1].frontier) if i else {}

    def latest(self) -> dict[str, int]:
        """The frontier of the newest binding (``{}`` if none)."""
        return dict(self.history[-1].frontier) if self.history else {}

    def between(self, lower: int, upper: int) -> list[Binding]:
        """Bindings with ``lower <= time < upper``."""
        i, j = bisect.bisect_left(self._times, lower), bisect.bisect_left(self._times, upper)
        return list(self.history[i:j])

    def files(self) -> dict[int, BoundFile]:
        """Every bound file by ordinal."""
        return {f.ordinal: f for b in self.history for f in b.files}

    def bound_keys(self) -> set[str]:
        return {f.key for b in self.history for f in b.files}


def check_monotonic(old: Frontier, new: Frontier, *, where: str) -> None:
    """Refuse a frontier that moves back or drops a partition (a binding is never undone)."""
    back = {p: (o, new.get(p)) for p, o in old.items() if new.get(p, -1) < o}
    if back:
        raise CorruptionError(
            f"{where}: the source's progress moved back {back} (partition: (bound, now)); bindings are final, "
            "so records there would be lost or duplicated. Was the topic or folder re-created?")


def spans(bindings: Bindings, lower: int, upper: int) -> list[Span]:
    """The offset ranges of the batch ``[lower, upper)`` with the time each is stamped with.

    Raises InvalidUsageError if ``upper - 1`` is not bound yet (a description is only
    minted after its binding) and CorruptionError if the bindings needed were compacted.
    """
    if upper <= lower:
        return []
    prev = bindings.frontier_at(lower - 1)
    bindings.frontier_at(upper - 1)  # raises when not bound yet
    out: list[Span] = []
    for b in bindings.between(lower, upper):
        for p in sorted(b.frontier):
            start, end = prev.get(p, 0), b.frontier[p]
            if end > start:
                out.append(Span(p, start, end, b.time))
        prev = dict(b.frontier)
    return out


def split(all_spans: Sequence[Span], *, slot: int, slots: int, chunk: int) -> list[Span]:
    """Slot ``slot`` of ``slots``: spans cut at multiples of ``chunk`` offsets, dealt by chunk.

    Stable: a chunk's slot depends only on its partition and start offset, so every
    attempt of a slot reads the same offsets, and the union over slots is every span once.
    """
    import zlib

    out = []
    for s in all_spans:
        a = s.start
        while a < s.end:
            b = min(s.end, (a // chunk + 1) * chunk)
            if zlib.crc32(f"{s.partition}:{a // chunk}".encode()) % slots == slot:
                out.append(Span(s.partition, a, b, s.time))
            a = b
    return out


def binding_rows(old: Frontier, new: Frontier, files: Iterable[BoundFile]) -> list[dict[str, object]]:
    """The remap updates of one binding: ``-1`` old / ``+1`` new frontier elements, ``+1`` per new file."""
    rows: list[dict[str, object]] = []
    for p in sorted(set(old) | set(new)):
        if old.get(p) == new.get(p):
            continue
        if p in old:
            rows.append({"partition": p, "offset": old[p], "name": "", "size": 0, "diff": -1})
        rows.append({"partition": p, "offset": new[p], "name": "", "size": 0, "diff": 1})
    for f in files:
        rows.append({"partition": FILE_ROW, "offset": f.ordinal, "name": f.key, "size": f.size, "diff": 1})
        if f.identity:
            rows.append({"partition": FILE_ID_ROW, "offset": f.ordinal, "name": f.identity, "size": 0, "diff": 1})
    return rows


#: Partition name of the rows recording which file got which ordinal (never retracted).
FILE_ROW = "#file"
#: Partition name of the rows recording a bound file's identity (``name``), by ordinal.
FILE_ID_ROW = "#file-id"


def replay(updates: Iterable[tuple[str, int, str, int, int, int]], *, upper: int, since: int) -> Bindings:
    """Rebuild the bindings from remap updates ``(partition, offset, name, size, time, diff)``."""
    by_time: dict[int, list[tuple[str, int, str, int, int]]] = {}
    for p, o, n, s, t, d in updates:
        by_time.setdefault(t, []).append((p, o, n, s, d))
    frontier: dict[str, int] = {}
    history = []
    for t in sorted(by_time):
        counts: dict[tuple[str, int], int] = {(p, o): 1 for p, o in frontier.items()}
        files = []
        ids = {o: n for p, o, n, _, _ in by_time[t] if p == FILE_ID_ROW}
        for p, o, n, s, d in by_time[t]:
            if p == FILE_ID_ROW:
                continue
            if p == FILE_ROW:
                if d != 1:
                    raise CorruptionError(f"remap: file {n!r} (ordinal {o}) has diff {d} at {t}; expected +1")
                files.append(BoundFile(o, n, s, ids.get(o, "")))
                continue
            counts[(p, o)] = counts.get((p, o), 0) + d
        live = {k: c for k, c in counts.items() if c}
        if any(c != 1 for c in live.values()) or len({p for p, _ in live}) != len(live):
            raise CorruptionError(f"remap: the frontier at time {t} is not one offset per partition: {live}")
        new = {p: o for p, o in live}
        check_monotonic(frontier, new, where=f"remap binding at {t}")
        frontier = new
        history.append(Binding(t, dict(frontier), tuple(sorted(files, key=lambda f: f.ordinal))))
    return Bindings(upper=upper, since=since, history=tuple(history))
