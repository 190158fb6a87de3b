"""Schema evolution, pure: a shard's schema history, the allowed changes, and projections.

Every user column has a stable **field id**. A shard's state carries its history
(:attr:`shardsink.core.state.Header.schemas`: schema id → fields) and every batch the schema
id its parts were written with (:attr:`shardsink.core.state.BatchMeta.schema_id`). Parts keep
their Parquet column names; a read maps a part's columns to the reader's schema by field id
(:func:`projection_for`, :func:`project`), so a rename never rewrites data.

A shard that never evolved stores no history: its one schema is ``header.schema`` with id 0
and field ids ``1..n`` by position (:func:`history`), derived on read, nothing rewritten.

Allowed changes (:class:`SchemaChange`, checked by :func:`evolve`): add a nullable column
(a non-nullable one only while the shard holds no batch); drop a column (hidden from current
reads at once, still shown by ``as_of`` reads before the drop; its data goes when compaction
rewrites the parts once ``since`` passes the drop); rename; make a column nullable;
widen a type (int8 → int16 → int32 → int64, float32 → float64, a decimal's precision up at
the same scale, string → large_string). Anything else is an InvalidUsageError (CLI exit 2)
naming the column, the old and new type and what would be allowed. New names follow
:func:`shardsink.core.updates.check_name`, and the schema after a change passes
:func:`shardsink.core.updates.check_schema` (no two names equal ignoring case: renaming a
column to another case of its own name is allowed, adding ``ID`` beside ``id`` is not).

A writer that needs the shard to hold a **target** schema (new columns of its input, wider
types) asks for the target, not for changes: :func:`changes_to` plans the adds and widenings
from whatever schema is current (a :class:`Clash` when a column cannot get there), and the
evolve-to-target rule (:mod:`shardsink.core.transitions`) applies that plan on the head it
commits on, all changes as one schema id.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from shardsink.core.state import FieldSpec, Header, SchemaEntry
from shardsink.core.updates import DIFF, TIME, check_name, check_schema
from shardsink.errors import CorruptionError, InvalidUsageError

ChangeKind = Literal["add", "drop", "rename", "widen", "nullable"]
CHANGE_KINDS: tuple[ChangeKind, ...] = ("add", "drop", "rename", "widen", "nullable")

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_DECIMAL = re.compile(r"decimal(128|256)?\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:,\s*tz=([A-Za-z0-9_+\-:/]+))?\]")
_ALLOWED = ("int8 -> int16 -> int32 -> int64, float -> double, decimal128(p,s) -> decimal128(p2,s) with p2 > p, "
            "string -> large_string")


# --- types ------------------------------------------------------------------------


def parse_type(alias: str) -> pa.DataType:
    """A pyarrow type from its alias (``int64``, ``string``, ``double``, ``timestamp[ms]``,
    ``timestamp[us, tz=UTC]``, ``decimal128(12,2)``, …); InvalidUsageError for anything else."""
    if not isinstance(alias, str) or not alias or len(alias) > 100:
        raise InvalidUsageError(f"type {alias!r:.120} is not a pyarrow type alias", value=str(alias)[:120])
    a = alias.strip()
    if m := _DECIMAL.fullmatch(a):
        width, p, s = m.group(1) or "128", int(m.group(2)), int(m.group(3))
        limit = 38 if width == "128" else 76
        if not 1 <= p <= limit or not 0 <= s <= p:
            raise InvalidUsageError(f"type {alias!r}: decimal{width} needs 1 <= precision <= {limit} and "
                                    "0 <= scale <= precision", value=alias)
        return pa.decimal128(p, s) if width == "128" else pa.decimal256(p, s)
    if m := _TIMESTAMP.fullmatch(a):
        return pa.timestamp(m.group(1), tz=m.group(2))
    try:
        return pa.type_for_alias(a)
    except (ValueError, KeyError) as e:
        raise InvalidUsageError(f"type {alias!r} is not a pyarrow type alias; expected e.g. int64, string, double, "
                                "timestamp[ms], decimal128(12,2)", value=alias) from e


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of ``old`` casts to ``new`` exactly (the allowed widenings)."""
    if old in _INTS and new in _INTS:
        return _INTS.index(new) > _INTS.index(old)
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(new.scale == old.scale and new.precision > old.precision
                    and (old.bit_width <= new.bit_width))
    return old == pa.string() and new == pa.large_string()


# --- history ----------------------------------------------------------------------


#: :func:`arrow_text` of the schema objects asked about last, by ``id`` (each entry holds its
#: schema, so an id is not re-used while it is here): a decoded header's schema is one object
#: per distinct schema (:func:`_from_arrow` and the state codec's cache), asked about per read.
_TEXTS: dict[int, tuple[pa.Schema, str]] = {}
_TEXTS_MAX = 64


def arrow_text(schema: pa.Schema) -> str:
    """The exact Arrow schema as stored in a :class:`SchemaEntry` (base64 IPC). Pure (a schema
    is immutable): the text of the same schema object is computed once while it is remembered."""
    hit = _TEXTS.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    text = base64.b64encode(schema.serialize().to_pybytes()).decode()
    if len(_TEXTS) >= _TEXTS_MAX:
        _TEXTS.clear()
    _TEXTS[id(schema)] = (schema, text)
    return text


@functools.lru_cache(maxsize=256)
def _from_arrow(arrow: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(arrow)))


def entry_schema(entry: SchemaEntry) -> pa.Schema:
    """The Arrow schema of ``entry`` (its user columns, by name)."""
    return _from_arrow(entry.arrow)


def make_entry(schema: pa.Schema, ids: Sequence[int], *, id: int, seqno: int, at: str,
               upper: int | None) -> SchemaEntry:
    fields = tuple(FieldSpec(i, f.name, str(f.type), f.nullable) for i, f in zip(ids, schema, strict=True))
    return SchemaEntry(id, fields, arrow_text(schema), seqno, at, upper)


#: The Parquet field ids of ``_time`` and ``_diff`` in every part (above any user field id a shard
#: hands out; the Iceberg view's schemas use them too).
TIME_FIELD_ID = 2_000_000_001
DIFF_FIELD_ID = 2_000_000_002


def parquet_field_ids(entry: SchemaEntry) -> tuple[tuple[str, int], ...]:
    """``(column, field id)`` of parts written with schema ``entry``: its fields, ``_time``, ``_diff``."""
    return (*((f.name, f.id) for f in entry.fields), (TIME, TIME_FIELD_ID), (DIFF, DIFF_FIELD_ID))


def history(header: Header) -> tuple[SchemaEntry, ...]:
    """The schema history, oldest first; a shard that never evolved has one implicit entry
    (id 0, field ids 1..n by position, seqno 0, upper and time unknown)."""
    if header.schemas:
        return header.schemas
    return (_implicit(arrow_text(header.schema)),)


@functools.lru_cache(maxsize=64)
def _implicit(arrow: str) -> SchemaEntry:
    schema = _from_arrow(arrow)
    return make_entry(schema, range(1, len(schema) + 1), id=0, seqno=0, at="", upper=None)


def current(header: Header) -> SchemaEntry:
    return history(header)[-1]


def entry(header: Header, schema_id: int) -> SchemaEntry | None:
    """The schema ``schema_id`` of the shard, None if it knows no such schema."""
    return next((e for e in history(header) if e.id == schema_id), None)


def known(header: Header, schema_id: object, *, url: str = "the shard") -> SchemaEntry:
    """The entry of ``schema_id``; InvalidUsageError (bad input) if the shard does not know it."""
    if isinstance(schema_id, bool) or not isinstance(schema_id, int) or (e := entry(header, schema_id)) is None:
        ids = [e.id for e in history(header)]
        raise InvalidUsageError(f"schema id {schema_id!r} is unknown on {url}; it knows schema ids {ids}",
                                value=str(schema_id))
    return e


def as_of(header: Header, time: int) -> SchemaEntry:
    """The schema current at data time ``time``: the newest entry made current at an upper
    ``<= time`` (the first entry if none was)."""
    hist = history(header)
    out = hist[0]
    for e in hist[1:]:
        if e.upper is None or e.upper > time:
            break
        out = e
    return out


def id_of(header: Header, schema: pa.Schema) -> int | None:
    """The newest schema id whose Arrow schema equals ``schema``; None if none does."""
    for e in reversed(history(header)):
        if entry_schema(e).equals(schema):
            return e.id
    return None


# --- changes ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SchemaChange:
    """One schema change: ``add`` (``name``, ``type``, ``nullable``), ``drop`` (``name``),
    ``rename`` (``name`` → ``new_name``), ``widen`` (``name`` to ``type``), ``nullable`` (``name``)."""

    kind: ChangeKind
    name: str
    type: str | None = None
    new_name: str | None = None
    nullable: bool = True

    def describe(self) -> str:
        return {"add": f"add {self.name}:{self.type}", "drop": f"drop {self.name}",
                "rename": f"rename {self.name}:{self.new_name}", "widen": f"widen {self.name}:{self.type}",
                "nullable": f"make {self.name} nullable"}[self.kind]


def evolve(header: Header, change: SchemaChange) -> tuple[pa.Schema, tuple[int, ...]]:
    """The next schema (and its field ids) after ``change``, or InvalidUsageError naming the
    column, the old and new type and what is allowed. Pure; nothing is written."""
    return evolve_all(header, (change,))


def evolve_all(header: Header, changes: Sequence[SchemaChange]) -> tuple[pa.Schema, tuple[int, ...]]:
    """The schema (and its field ids) after ``changes`` applied in order to the current one,
    each checked as :func:`evolve` checks one (a new column's field id is the next unused one).
    Pure; nothing is written."""
    cur = current(header)
    schema, ids = entry_schema(cur), tuple(f.id for f in cur.fields)
    next_id = 1 + max((f.id for e in history(header) for f in e.fields), default=0)
    for change in changes:
        schema, ids = _evolve(schema, ids, change, next_id=next_id, has_rows=header.stats.batches > 0)
        check_schema(schema, what=f"the schema after {change.describe()}")
        next_id += change.kind == "add"
    return schema, ids


def _evolve(schema: pa.Schema, ids: tuple[int, ...], change: SchemaChange, *, next_id: int,
            has_rows: bool) -> tuple[pa.Schema, tuple[int, ...]]:
    if change.kind not in CHANGE_KINDS:
        raise InvalidUsageError(f"schema change {change.kind!r} is unknown; expected one of {CHANGE_KINDS}")
    fields = list(schema)
    name = check_name(change.name) if change.kind == "add" else change.name
    if not isinstance(name, str):
        raise InvalidUsageError(f"column name {name!r:.120} is not a string", value=str(name)[:120])
    where = schema.get_field_index(name)
    if change.kind == "add":
        new_type = parse_type(change.type or "")
        if where >= 0:
            raise InvalidUsageError(f"cannot add column {name!r} ({new_type}): a column {name!r} "
                                    f"({schema.field(name).type}) exists; --drop {name} first to replace it",
                                    value=name)
        if not change.nullable and has_rows:
            raise InvalidUsageError(f"cannot add non-nullable column {name!r} ({new_type}) to a shard that holds "
                                    "data: its old rows would have no value; add it nullable", value=name)
        return schema.append(pa.field(name, new_type, change.nullable)), (*ids, next_id)
    if where < 0:
        raise InvalidUsageError(f"column {name!r} does not exist; the columns are {schema.names}", value=name)
    old = fields[where]
    if change.kind == "drop":
        if len(fields) == 1:
            raise InvalidUsageError(f"cannot drop {name!r}: it is the shard's only column", value=name)
        return schema.remove(where), (*ids[:where], *ids[where + 1:])
    if change.kind == "rename":
        new = check_name(change.new_name)
        if schema.get_field_index(new) >= 0:
            raise InvalidUsageError(f"cannot rename {name!r} to {new!r}: a column {new!r} exists; "
                                    f"--drop {new} first", value=new)
        return schema.set(where, old.with_name(new)), ids
    if change.kind == "nullable":
        if old.nullable:
            raise InvalidUsageError(f"column {name!r} ({old.type}) is already nullable", value=name)
        return schema.set(where, old.with_nullable(True)), ids
    new_type = parse_type(change.type or "")
    if not widens(old.type, new_type):
        raise InvalidUsageError(f"cannot change column {name!r} from {old.type} to {new_type}: only widening is "
                                f"allowed ({_ALLOWED})", value=name)
    return schema.set(where, old.with_type(new_type)), ids


# --- targets ----------------------------------------------------------------------


@dataclass(frozen=True)
class Clash:
    """Why ``schema`` cannot reach a target by adds and widenings: its column ``name`` is
    ``held``, which neither equals, widens to nor is wider than the target's ``wanted``."""

    name: str
    held: str
    wanted: str

    def describe(self) -> str:
        return f"needs column {self.name!r} as {self.wanted}, but the shard's is {self.held}"


def fields_text(schema: pa.Schema) -> str:
    """``schema``'s columns for a message: ``name: type`` (``not null`` when required), comma-separated."""
    return ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def holds(held: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``held`` holds every value of type ``wanted`` exactly (the same
    type, a widening of it, or ``wanted`` is the null type)."""
    return held == wanted or widens(wanted, held) or pa.types.is_null(wanted)


def changes_to(schema: pa.Schema, target: pa.Schema) -> tuple[SchemaChange, ...] | Clash:
    """The changes that make ``schema`` hold every column of ``target``: adds (nullable, in
    ``target``'s order), then widenings (likewise); none when it holds them already (the same
    type, or a wider one). A column of ``schema`` that holds neither way is a :class:`Clash`.
    Columns ``target`` lacks are left alone. Pure: what the evolve-to-target rule applies
    (:func:`shardsink.core.transitions.evolve_to_target`) and what a dry run reports."""
    adds: list[SchemaChange] = []
    widenings: list[SchemaChange] = []
    for f in target:
        i = schema.get_field_index(f.name)
        if i < 0:
            adds.append(SchemaChange(kind="add", name=f.name, type=str(f.type), nullable=True))
            continue
        held = schema.field(i).type
        if widens(held, f.type):
            widenings.append(SchemaChange(kind="widen", name=f.name, type=str(f.type)))
        elif not holds(held, f.type):
            return Clash(f.name, str(held), str(f.type))
    return (*adds, *widenings)


# --- projection -------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnProjection:
    """How one column of the reader's schema is read from a part: from the part's column
    ``source`` (None: the part predates the column, read as nulls), cast to ``type``."""

    name: str
    source: str | None
    type: pa.DataType
    nullable: bool
    field_id: int


def projection_for(source: SchemaEntry, target: SchemaEntry) -> tuple[ColumnProjection, ...]:
    """The reader's columns (``target``) as read from a part written under ``source``, by field
    id: renamed columns from their old name, added ones as nulls, widened ones cast; columns
    ``target`` dropped are not listed. The ONE mapping every reader (core, DuckDB, Polars, …) uses."""
    by_id = {f.id: f.name for f in source.fields}
    schema = entry_schema(target)
    return tuple(ColumnProjection(f.name, by_id.get(spec.id), f.type, f.nullable, spec.id)
                 for spec, f in zip(target.fields, schema, strict=True))


def project(table: pa.Table, source: SchemaEntry, target: SchemaEntry, *, where: str = "a part") -> pa.Table:
    """``table`` (a part's user columns by ``source``'s names, then ``_time``, ``_diff``) as the
    reader's schema ``target`` (see :func:`projection_for`); same rows, same order.

    HAZARD: ``target`` may be older and narrower than ``source`` (an ``as_of`` read), so callers
    filter ``table`` to the read's times first; a value that then still does not fit ``target``
    is corruption: CorruptionError naming ``where`` and the column.
    """
    if source is target or source.id == target.id:
        return table
    cols, fields = [], []
    for c in projection_for(source, target):
        col = pa.nulls(table.num_rows, c.type) if c.source is None else _cast(table[c.source], c, where)
        cols.append(col)
        fields.append(pa.field(c.name, c.type, c.nullable))
    for n in (TIME, DIFF):
        cols.append(table[n])
        fields.append(table.schema.field(n))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _cast(col: pa.ChunkedArray, c: ColumnProjection, where: str) -> pa.ChunkedArray:
    try:
        return col.cast(c.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise CorruptionError(f"{where}: column {c.name!r} (field id {c.field_id}, stored as {c.source!r}) holds a "
                              f"value that is not a {c.type} under the schema at the read's time: {e}") from e
