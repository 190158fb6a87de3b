"""Shard state as immutable values, and the pure transitions between them. No I/O here.

A shard's history is a chain of **state versions** numbered by ``seqno`` (0, 1, 2, …).
Each version carries

* a small **header** (upper, since, schema, idempotency records, running stats, and a
  pointer to a rollup), whose size does not grow with the shard's history, and
* a **diff**: the batches this version added and the batch ids it removed.

The full list of live batches at version ``n`` is the batches of rollup ``r`` (a
snapshot of the batch list, ``r = header.rollup``; ``r = 0`` is the empty list) with
the diffs of versions ``r+1 .. n`` applied. Committing reads and writes headers and
diffs only, so its cost is constant in the length of the history.

:func:`compare_and_append` is the commit rule of DESIGN.md as a pure function:
(header, command) → the next version, or a typed refusal. The maintenance
transitions sit beside it, equally pure: :func:`apply_compaction` (replace live
input batches by their merge; refused unless every input is still live),
:func:`advance_since` and :func:`set_retention`. All of them are committed by the same
conditional put (``Machine.commit``), so maintenance never blocks appends: a lost race
re-applies the step on the fresh head.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pyarrow as pa

from shardsink.errors import CorruptionError, InvalidUsageError

FORMAT = 1
#: How many recent description ids each header remembers for idempotency.
RECENT_DESCS = 128
#: How many writers' last commits each header remembers.
WRITERS = 64

CommitKind = Literal["create", "append", "close", "compact", "since", "retention"]


@dataclass(frozen=True)
class PartMeta:
    """One immutable Parquet object of updates, all times in ``[min_time, max_time]``."""

    key: str
    rows: int
    bytes: int
    min_time: int
    max_time: int


@dataclass(frozen=True)
class BatchMeta:
    """The parts one batch description committed, with its bounds."""

    desc_id: str
    lower: int
    upper: int | None
    seqno: int
    parts: tuple[PartMeta, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)


@dataclass(frozen=True)
class WriterRecord:
    writer: str
    desc_id: str
    seqno: int
    at: str


@dataclass(frozen=True)
class Stats:
    batches: int = 0
    parts: int = 0
    rows: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CommitInfo:
    """Who committed what, when: the entry ``shardsink log`` shows.

    ``lower``/``upper`` are the batch bounds for append/close/compact, the old and new
    ``since`` for a since advance, the old and new retention (ms) for a retention change.
    """

    kind: CommitKind
    at: str
    writer: str
    desc_id: str | None
    lower: int | None
    upper: int | None
    rows: int
    nonce: str


@dataclass(frozen=True)
class Header:
    seqno: int
    upper: int | None  # None: closed (the empty frontier)
    since: int
    schema: pa.Schema = field(compare=False)
    rollup: int
    recent: tuple[tuple[str, int], ...]  # (desc_id or compaction id, seqno), oldest first
    writers: tuple[WriterRecord, ...]
    stats: Stats
    #: Time-travel window in ms (None: keep all history): maintenance keeps
    #: ``since <= upper - retention``. Stored field, added last (codec default None).
    retention: int | None = None

    def committed_seqno(self, desc_id: str) -> int | None:
        for d, s in self.recent:
            if d == desc_id:
                return s
        return None


@dataclass(frozen=True)
class Version:
    header: Header
    added: tuple[BatchMeta, ...]
    removed: tuple[str, ...]
    commit: CommitInfo

    @property
    def seqno(self) -> int:
        return self.header.seqno


# --- commands and refusals ---------------------------------------------------------


@dataclass(frozen=True)
class AppendCommand:
    """Append ``parts`` as the batch ``[lower, upper)`` named ``desc_id``.

    ``upper=None`` closes the shard. ``nonce`` identifies this one call, so that an
    unknown outcome can be resolved by recognising our own version.
    """

    desc_id: str
    lower: int
    upper: int | None
    parts: tuple[PartMeta, ...]
    writer: str
    at: str
    nonce: str


@dataclass(frozen=True)
class AlreadyCommitted:
    seqno: int


@dataclass(frozen=True)
class UpperMismatch:
    current: int | None


@dataclass(frozen=True)
class InputsGone:
    """A compaction refused: these input batches are no longer live (another compaction
    replaced them). It can never apply; its output must be deleted by its fate."""

    missing: tuple[str, ...]


@dataclass(frozen=True)
class Unchanged:
    """A maintenance command that would change nothing (``since`` already there, same
    retention): no version is written."""

    reason: str


Refusal = AlreadyCommitted | UpperMismatch | InputsGone | Unchanged


@dataclass(frozen=True)
class CompactCommand:
    """Replace the live, adjacent batches ``inputs`` by one batch of ``parts``.

    ``compaction_id`` names the output (its parts live under ``parts/<compaction_id>/``)
    and is recorded in ``header.recent`` like a description id, so the compaction's fate
    is decidable (``core.fate``). ``since`` is the frontier the output was consolidated
    at: every time below it was advanced to it; it must not exceed the shard's since.
    ``lower``/``upper`` are the merged bounds (the first input's lower, the last's upper).
    """

    compaction_id: str
    inputs: tuple[str, ...]
    lower: int
    upper: int | None
    since: int
    parts: tuple[PartMeta, ...]
    writer: str
    at: str
    nonce: str


@dataclass(frozen=True)
class SinceCommand:
    """Advance ``since`` to ``min(upper - retention, lease_cap, target)`` (never backwards).

    ``lease_cap`` is the lowest ``as_of`` of the live leases listed just before the
    commit (None: no lease). ``target`` is an explicit ceiling (None: retention only).
    With no retention and no target nothing moves. ``since`` never passes ``upper - 1``
    while the shard is open, so the newest time stays readable.
    """

    lease_cap: int | None
    target: int | None
    writer: str
    at: str
    nonce: str


@dataclass(frozen=True)
class RetentionCommand:
    """Set the shard's time-travel window to ``retention`` ms (None: keep all history)."""

    retention: int | None
    writer: str
    at: str
    nonce: str


def initial_version(*, schema: pa.Schema, upper: int, writer: str, at: str, nonce: str) -> Version:
    header = Header(0, upper, 0, schema, 0, (), (), Stats())
    return Version(header, (), (), CommitInfo("create", at, writer, None, None, upper, 0, nonce))


def compare_and_append(header: Header, cmd: AppendCommand) -> Version | Refusal:
    """The commit rule. Bounds were validated by the caller (``lower < upper``)."""
    done = header.committed_seqno(cmd.desc_id)
    if done is not None:
        return AlreadyCommitted(done)
    if header.upper != cmd.lower:
        return UpperMismatch(header.upper)
    seqno = header.seqno + 1
    rows = sum(p.rows for p in cmd.parts)
    added = (BatchMeta(cmd.desc_id, cmd.lower, cmd.upper, seqno, cmd.parts),) if cmd.parts else ()
    writers = tuple(w for w in header.writers if w.writer != cmd.writer)
    writers = (*writers, WriterRecord(cmd.writer, cmd.desc_id, seqno, cmd.at))[-WRITERS:]
    s = header.stats
    stats = Stats(
        s.batches + len(added),
        s.parts + len(cmd.parts),
        s.rows + rows,
        s.bytes + sum(p.bytes for p in cmd.parts),
    )
    new = replace(
        header,
        seqno=seqno,
        upper=cmd.upper,
        recent=(*header.recent, (cmd.desc_id, seqno))[-RECENT_DESCS:],
        writers=writers,
        stats=stats,
    )
    kind: CommitKind = "close" if cmd.upper is None else "append"
    info = CommitInfo(kind, cmd.at, cmd.writer, cmd.desc_id, cmd.lower, cmd.upper, rows, cmd.nonce)
    return Version(new, added, (), info)


def _bumped(header: Header, seqno: int, entry: str, writer: str, at: str) -> Header:
    """``header`` at ``seqno`` with ``entry`` recorded in ``recent`` and ``writer``'s record."""
    writers = tuple(w for w in header.writers if w.writer != writer)
    writers = (*writers, WriterRecord(writer, entry, seqno, at))[-WRITERS:]
    return replace(header, seqno=seqno, recent=(*header.recent, (entry, seqno))[-RECENT_DESCS:], writers=writers)


def apply_compaction(header: Header, batches: Sequence[BatchMeta], cmd: CompactCommand) -> Version | Refusal:
    """The compaction rule: ``batches`` are the live batches at ``header``.

    Applies only if every input is still live, adjacent and in order (then they are
    replaced, in place, by one batch named ``compaction_id``, or by nothing if the merge
    consolidated to no updates). The upper never changes. Refusals: AlreadyCommitted
    (``compaction_id`` in the idempotency window), InputsGone (an input was replaced by
    another compaction: this one can never apply).
    """
    done = header.committed_seqno(cmd.compaction_id)
    if done is not None:
        return AlreadyCommitted(done)
    ids = [b.desc_id for b in batches]
    missing = tuple(i for i in cmd.inputs if i not in ids)
    if missing:
        return InputsGone(missing)
    first = ids.index(cmd.inputs[0])
    if tuple(ids[first:first + len(cmd.inputs)]) != cmd.inputs:
        # Live but no longer adjacent cannot happen (batches only ever leave the list, and
        # a merge takes an adjacent run's place): treat a foreign layout as a lost race.
        return InputsGone(())
    if cmd.since > header.since:
        raise InvalidUsageError(
            f"compaction {cmd.compaction_id} was consolidated at since {cmd.since}, above the shard's {header.since}"
        )
    gone = batches[first:first + len(cmd.inputs)]
    seqno = header.seqno + 1
    added = (BatchMeta(cmd.compaction_id, cmd.lower, cmd.upper, seqno, cmd.parts),) if cmd.parts else ()
    s = header.stats
    stats = Stats(
        s.batches - len(gone) + len(added),
        s.parts - sum(len(b.parts) for b in gone) + len(cmd.parts),
        s.rows - sum(b.rows for b in gone) + sum(p.rows for p in cmd.parts),
        s.bytes - sum(b.bytes for b in gone) + sum(p.bytes for p in cmd.parts),
    )
    new = replace(_bumped(header, seqno, cmd.compaction_id, cmd.writer, cmd.at), stats=stats)
    rows = sum(p.rows for p in cmd.parts)
    info = CommitInfo("compact", cmd.at, cmd.writer, cmd.compaction_id, cmd.lower, cmd.upper, rows, cmd.nonce)
    return Version(new, added, cmd.inputs, info)


def since_target(header: Header, cmd: SinceCommand) -> int:
    """Where :func:`advance_since` would put ``since`` (may be <= the current since)."""
    caps = [c for c in (cmd.lease_cap, cmd.target) if c is not None]
    if header.upper is not None:
        if header.retention is not None:
            caps.append(header.upper - max(1, header.retention))
        elif cmd.target is None:
            return header.since
        caps.append(header.upper - 1)
    elif header.retention is None and cmd.target is None:
        return header.since
    return min(caps) if caps else header.since


def advance_since(header: Header, cmd: SinceCommand) -> Version | Refusal:
    """The since rule (DESIGN.md "Retention and grace"): never backwards, never past a lease."""
    new_since = since_target(header, cmd)
    if new_since <= header.since:
        return Unchanged(f"since stays at {header.since} (target {new_since})")
    seqno = header.seqno + 1
    new = replace(header, seqno=seqno, since=new_since)
    info = CommitInfo("since", cmd.at, cmd.writer, None, header.since, new_since, 0, cmd.nonce)
    return Version(new, (), (), info)


def set_retention(header: Header, cmd: RetentionCommand) -> Version | Refusal:
    """Record the shard's retention (ms, or None for all history); Unchanged if it is already so."""
    if cmd.retention is not None and cmd.retention < 1:
        raise InvalidUsageError(f"retention {cmd.retention} ms must be at least 1")
    if header.retention == cmd.retention:
        return Unchanged(f"retention is already {cmd.retention}")
    seqno = header.seqno + 1
    new = replace(header, seqno=seqno, retention=cmd.retention)
    info = CommitInfo("retention", cmd.at, cmd.writer, None, header.retention, cmd.retention, 0, cmd.nonce)
    return Version(new, (), (), info)


def apply_diffs(batches: Sequence[BatchMeta], versions: Iterable[Version]) -> tuple[BatchMeta, ...]:
    """The live batch list after applying ``versions`` (consecutive seqnos) in order.

    Appends go to the end; a compaction's output takes the place of its first input, so
    the list stays in time order.
    """
    out = list(batches)
    for v in versions:
        if v.removed and v.commit.kind == "compact":
            gone = set(v.removed)
            at = next((i for i, b in enumerate(out) if b.desc_id in gone), len(out))
            out = [b for b in out[:at] if b.desc_id not in gone] + list(v.added) + [
                b for b in out[at:] if b.desc_id not in gone
            ]
            continue
        if v.removed:
            gone = set(v.removed)
            out = [b for b in out if b.desc_id not in gone]
        out.extend(v.added)
    return tuple(out)


def with_rollup(version: Version, rollup: int) -> Version:
    """``version`` pointing at a newer rollup (used for the LATEST hint)."""
    if rollup <= version.header.rollup:
        return version
    return replace(version, header=replace(version.header, rollup=rollup))


# --- JSON codec ---------------------------------------------------------------------


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def schema_from_json(d: Mapping[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(d["arrow"])))


def _part_json(p: PartMeta) -> dict[str, Any]:
    return {"key": p.key, "rows": p.rows, "bytes": p.bytes, "min_time": p.min_time, "max_time": p.max_time}


def _batch_json(b: BatchMeta) -> dict[str, Any]:
    return {
        "desc_id": b.desc_id,
        "lower": b.lower,
        "upper": b.upper,
        "seqno": b.seqno,
        "parts": [_part_json(p) for p in b.parts],
    }


def _batch(d: Mapping[str, Any]) -> BatchMeta:
    parts = tuple(PartMeta(p["key"], p["rows"], p["bytes"], p["min_time"], p["max_time"]) for p in d["parts"])
    return BatchMeta(d["desc_id"], d["lower"], d["upper"], d["seqno"], parts)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def encode_version(v: Version) -> bytes:
    h = v.header
    return _dumps(
        {
            "format": FORMAT,
            "seqno": h.seqno,
            "header": {
                "upper": h.upper,
                "since": h.since,
                "schema": schema_to_json(h.schema),
                "rollup": h.rollup,
                "recent": [list(r) for r in h.recent],
                "writers": [vars(w) for w in h.writers],
                "stats": vars(h.stats),
                "retention": h.retention,
            },
            "added": [_batch_json(b) for b in v.added],
            "removed": list(v.removed),
            "commit": vars(v.commit),
        }
    )


def decode_version(data: bytes, *, where: str) -> Version:
    """Parse a state version, raising CorruptionError naming ``where`` if it is unreadable."""
    try:
        d = json.loads(data)
        if d.get("format") != FORMAT:
            raise CorruptionError(f"{where}: unsupported state format {d.get('format')!r} (expected {FORMAT})")
        h = d["header"]
        header = Header(
            seqno=int(d["seqno"]),
            upper=h["upper"],
            since=int(h["since"]),
            schema=schema_from_json(h["schema"]),
            rollup=int(h["rollup"]),
            recent=tuple((str(a), int(b)) for a, b in h["recent"]),
            writers=tuple(WriterRecord(**w) for w in h["writers"]),
            stats=Stats(**h["stats"]),
            retention=h.get("retention"),
        )
        return Version(
            header,
            tuple(_batch(b) for b in d["added"]),
            tuple(d["removed"]),
            CommitInfo(**d["commit"]),
        )
    except CorruptionError:
        raise
    except Exception as e:
        raise CorruptionError(f"{where}: unreadable state version ({type(e).__name__}: {e})") from e


def encode_rollup(seqno: int, batches: Sequence[BatchMeta]) -> bytes:
    return _dumps({"format": FORMAT, "seqno": seqno, "batches": [_batch_json(b) for b in batches]})


def decode_rollup(data: bytes, *, where: str) -> tuple[int, tuple[BatchMeta, ...]]:
    try:
        d = json.loads(data)
        if d.get("format") != FORMAT:
            raise CorruptionError(f"{where}: unsupported rollup format {d.get('format')!r}")
        return int(d["seqno"]), tuple(_batch(b) for b in d["batches"])
    except CorruptionError:
        raise
    except Exception as e:
        raise CorruptionError(f"{where}: unreadable rollup ({type(e).__name__}: {e})") from e
