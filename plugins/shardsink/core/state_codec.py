"""The JSON layout of state versions and rollups: their stored document types, encode, decode.

Unknown fields are ignored on decode (msgspec's default), so a newer writer's additions
do not break an older reader; a missing or mistyped field, or a format newer than
:data:`FORMAT`, is a CorruptionError naming the object. The bytes are canonical sorted
JSON. The values these documents carry are in :mod:`shardsink.core.state`, the commit
records in :mod:`shardsink.core.commits`.

Format 2 stores each version's commit as its kind's own record. A version of format 1 stored
one record shape for every kind, its ``lower``/``upper`` meaning the batch bounds of an
append, close or compaction, the old and new since of a since advance, the old and new
retention, or the old and new schema ids (the change in ``props``): :func:`_from_format1`
reads it as the record of its kind.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from shardsink.core import commits as cm
from shardsink.core.documents import ENCODER, D, decode_doc
from shardsink.core.schema import arrow_text
from shardsink.core.state import BatchMeta, Header, SchemaEntry, Stats, Version, WriterRecord
from shardsink.errors import CorruptionError

#: Format of state versions and rollups. Readers accept documents of this format or older
#: and ignore fields they do not know (a newer writer may add fields without bumping it);
#: a layout change that old readers cannot ignore bumps it, and they refuse clearly.
#: 2: commit records per kind (module docstring); rollups are unchanged since 1.
FORMAT = 2
ROLLUP_FORMAT = 1


class FieldDoc(msgspec.Struct, frozen=True):
    name: str
    type: str
    nullable: bool


class SchemaDoc(msgspec.Struct, frozen=True):
    """A readable list of fields (for humans and other tools) and the exact Arrow schema."""

    fields: tuple[FieldDoc, ...]
    arrow: str  # base64 of the Arrow IPC schema message


class HeaderDoc(msgspec.Struct, frozen=True, kw_only=True):
    upper: int | None
    since: int
    schema: SchemaDoc
    rollup: int
    recent: tuple[tuple[str, int], ...]
    writers: tuple[WriterRecord, ...]
    stats: Stats
    retention: int | None = None  # the time-travel window (ms); None keeps all history
    removal: int | None = None  # see Header.removal (None: written before the field existed)
    prior_removal: int | None = None
    #: The schema history (Header.schemas); UNSET (left out of the JSON) while empty, so
    #: versions of shards that never evolved keep the bytes format 1 always had.
    schemas: tuple[SchemaEntry, ...] | msgspec.UnsetType = msgspec.UNSET
    #: Shard options (Header.options); UNSET while none is set, like ``schemas``.
    options: tuple[tuple[str, str], ...] | msgspec.UnsetType = msgspec.UNSET


class VersionDoc(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    seqno: int
    header: HeaderDoc
    added: tuple[BatchMeta, ...]
    removed: tuple[str, ...]
    commit: msgspec.Raw  # a cm.Commit (format 2), or a _Format1Commit
    removed_lowers: tuple[int, ...] = ()


class _Format1Commit(msgspec.Struct, frozen=True):
    """The one commit record shape of format 1 (see the module docstring)."""

    kind: str
    at: str
    writer: str
    desc_id: str | None
    lower: int | None
    upper: int | None
    rows: int
    nonce: str
    props: tuple[tuple[str, str], ...] = ()


_COMMIT = msgspec.json.Decoder(cm.Commit)
_FORMAT1_COMMIT = msgspec.json.Decoder(_Format1Commit)


def _from_format1(c: _Format1Commit, where: str) -> cm.Commit:
    """A format-1 record as the record of its kind; CorruptionError if its fields do not fit it."""
    by = {"at": c.at, "writer": c.writer, "nonce": c.nonce}
    try:
        match c.kind:
            case "create":
                return cm.CreateCommit(**by, upper=_int(c.upper))
            case "append":
                return cm.AppendCommit(at=c.at, writer=c.writer, nonce=c.nonce, desc_id=_str(c.desc_id),
                                       lower=_int(c.lower), upper=_int(c.upper), rows=c.rows, props=c.props)
            case "close":
                return cm.CloseCommit(**by, desc_id=_str(c.desc_id), lower=_int(c.lower), rows=c.rows, props=c.props)
            case "compact":
                return cm.CompactCommit(**by, compaction_id=_str(c.desc_id), lower=_int(c.lower), upper=c.upper,
                                        rows=c.rows)
            case "since":
                return cm.SinceCommit(**by, old=_int(c.lower), new=_int(c.upper))
            case "retention":
                return cm.RetentionCommit(**by, old=c.lower, new=c.upper)
            case "schema":
                return cm.SchemaCommit(**by, old_id=_int(c.lower), new_id=_int(c.upper),
                                       change=dict(c.props).get("change", ""))
    except ValueError as e:
        raise CorruptionError(f"{where}: unreadable {c.kind} commit record of format 1 ({e})") from e
    raise CorruptionError(f"{where}: unknown commit kind {c.kind!r} in a version of format 1")


def _int(v: int | None) -> int:
    if v is None:
        raise ValueError("a bound is missing")
    return v


def _str(v: str | None) -> str:
    if v is None:
        raise ValueError("the batch id is missing")
    return v


class RollupDoc(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    seqno: int
    batches: tuple[BatchMeta, ...]


#: Canonical JSON: keys sorted at every level, no spaces (the bytes format 1 always had).
_ENCODER = ENCODER


def schema_doc(schema: pa.Schema) -> SchemaDoc:
    """The stored form of ``schema``: its fields, and its exact Arrow text
    (:func:`shardsink.core.schema.arrow_text`, remembered per schema object: every version a
    shard writes repeats the schema object its head decoded to)."""
    return SchemaDoc(tuple(FieldDoc(f.name, str(f.type), f.nullable) for f in schema), arrow_text(schema))


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """The schema as plain JSON values (for specs and CLI output)."""
    # Through JSON, not msgspec.to_builtins (which keeps tuples): specs must equal their own
    # JSON round trip (they are compared after travelling through XCom and sidecars).
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(schema_doc(schema)))
    return out


def schema_from_json(d: Mapping[str, Any]) -> pa.Schema:
    return _schema_from_arrow(str(d["arrow"]))


@functools.lru_cache(maxsize=64)
def _schema_from_arrow(arrow: str) -> pa.Schema:
    # Every version repeats the schema: decode each distinct one once.
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(arrow)))


def _decode_doc(data: bytes, kind: type[D], *, what: str, where: str) -> D:
    """Decode a stored document; CorruptionError naming ``where`` if unreadable or too new."""
    return decode_doc(data, kind, what=what, where=where, newest=FORMAT)


def encode_version(v: Version) -> bytes:
    h = v.header
    header = HeaderDoc(upper=h.upper, since=h.since, schema=schema_doc(h.schema), rollup=h.rollup,
                       recent=h.recent, writers=h.writers, stats=h.stats, retention=h.retention, removal=h.removal,
                       prior_removal=h.prior_removal, schemas=h.schemas if h.schemas else msgspec.UNSET,
                       options=h.options if h.options else msgspec.UNSET)
    doc = VersionDoc(format=FORMAT, seqno=h.seqno, header=header, added=v.added, removed=v.removed,
                     commit=msgspec.Raw(_ENCODER.encode(v.commit)), removed_lowers=v.removed_lowers)
    return _ENCODER.encode(doc)


def decode_version(data: bytes, *, where: str) -> Version:
    """Parse a state version, raising CorruptionError naming ``where`` if it is unreadable.

    Pure, and a Version is immutable: the same bytes decode once per process (the newest
    :data:`DECODED_VERSIONS` distinct documents of at most :data:`DECODED_MAX_BYTES` each are
    kept, so the cache holds a bounded size whatever the shard's history), however many handles
    read them (each opens its own cache) or whether through the hint or the version itself."""
    if type(data) is bytes and len(data) <= DECODED_MAX_BYTES:
        try:
            return _decoded(data)
        except CorruptionError:
            pass  # decoded again below, so the error names ``where``
    return _decode_version(data, where=where)


#: How many distinct state version documents :func:`decode_version` keeps decoded.
DECODED_VERSIONS = 256
#: The largest document :func:`decode_version` keeps decoded (256 of them: at most 16 MiB of bytes).
DECODED_MAX_BYTES = 64 * 1024


@functools.lru_cache(maxsize=DECODED_VERSIONS)
def _decoded(data: bytes) -> Version:
    return _decode_version(data, where="")


def _decode_version(data: bytes, *, where: str) -> Version:
    d = _decode_doc(data, VersionDoc, what="state version", where=where)
    h = d.header
    try:
        schema = _schema_from_arrow(h.schema.arrow)
    except Exception as e:
        raise CorruptionError(f"{where}: unreadable schema in state version ({type(e).__name__}: {e})") from e
    schemas = h.schemas if not isinstance(h.schemas, msgspec.UnsetType) else ()
    options = h.options if not isinstance(h.options, msgspec.UnsetType) else ()
    header = Header(d.seqno, h.upper, h.since, schema, h.rollup, h.recent, h.writers, h.stats, h.retention,
                    h.removal, h.prior_removal, schemas, options)
    try:
        commit = _COMMIT.decode(d.commit) if d.format >= 2 else _from_format1(_FORMAT1_COMMIT.decode(d.commit), where)
    except msgspec.DecodeError as e:
        raise CorruptionError(f"{where}: unreadable commit record in state version ({e})") from e
    return Version(header, d.added, d.removed, commit, d.removed_lowers)


def encode_rollup(seqno: int, batches: Sequence[BatchMeta]) -> bytes:
    return _ENCODER.encode(RollupDoc(format=ROLLUP_FORMAT, seqno=seqno, batches=tuple(batches)))


def decode_rollup(data: bytes, *, where: str) -> tuple[int, tuple[BatchMeta, ...]]:
    d = decode_doc(data, RollupDoc, what="rollup", where=where, newest=ROLLUP_FORMAT)
    return d.seqno, d.batches
