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
(header, command) → the next version, or a typed refusal.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pyarrow as pa

from shardsink.errors import CorruptionError

FORMAT = 1
#: How many recent description ids each header remembers for idempotency.
RECENT_DESCS = 128
#: How many writers' last commits each header remembers.
WRITERS = 64

CommitKind = Literal["create", "append", "close"]


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
    """Who committed what, when: the entry ``shardsink log`` shows."""

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
    recent: tuple[tuple[str, int], ...]  # (desc_id, seqno), oldest first
    writers: tuple[WriterRecord, ...]
    stats: Stats

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


Refusal = AlreadyCommitted | UpperMismatch


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


def apply_diffs(batches: Sequence[BatchMeta], versions: Iterable[Version]) -> tuple[BatchMeta, ...]:
    """The live batch list after applying ``versions`` (consecutive seqnos) in order."""
    out = list(batches)
    for v in versions:
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
