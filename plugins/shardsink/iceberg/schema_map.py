"""The shard's schemas as Iceberg schemas: its field ids, its types, ``_time`` and ``_diff``.

Every shard schema id becomes the Iceberg schema of the same id: the user columns with their
shard field ids, then ``_time`` (required long, :data:`TIME_ID`) and ``_diff`` (optional long,
:data:`DIFF_ID`). A part written without a ``_diff`` column (every diff 1) reads as null there:
null means 1. Parts written before field ids were written into Parquet are read through the
name mapping (``schema.name-mapping.default``): each field id with every name it has had. A name
reused by a later column (drop, then add again) maps to the earliest id that had it.

Types: bool, int8/16/32 (Iceberg int), int64, float32/64, string/large_string, binary/
large_binary, date32, timestamp[ms|us] (with a time zone: timestamptz), decimal128. Anything
else is refused when the view is turned on (InvalidUsageError naming the column and type).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa

from shardsink.core import schema as sc
from shardsink.core.state import Header, SchemaEntry
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import InvalidUsageError

#: The field ids of ``_time`` and ``_diff``: the ones core writes into every part.
TIME_ID = sc.TIME_FIELD_ID
DIFF_ID = sc.DIFF_FIELD_ID
SUPPORTED = ("bool, int8, int16, int32, int64, float, double, string, large_string, binary, large_binary, date32, "
             "timestamp[ms|us] (with or without tz), decimal128")


class Field(msgspec.Struct, frozen=True):
    id: int
    name: str
    required: bool
    type: str


class Schema(msgspec.Struct, frozen=True, rename={"schema_id": "schema-id"}):
    schema_id: int
    fields: tuple[Field, ...]
    type: str = "struct"


def iceberg_type(t: pa.DataType, *, column: str) -> str:
    """The Iceberg type of Arrow type ``t``; InvalidUsageError naming ``column`` if it has none here."""
    if pa.types.is_boolean(t):
        return "boolean"
    if t in (pa.int8(), pa.int16(), pa.int32()):
        return "int"
    if t == pa.int64():
        return "long"
    if t == pa.float32():
        return "float"
    if t == pa.float64():
        return "double"
    if t in (pa.string(), pa.large_string()):
        return "string"
    if t in (pa.binary(), pa.large_binary()):
        return "binary"
    if t == pa.date32():
        return "date"
    if pa.types.is_timestamp(t) and t.unit in ("ms", "us"):
        return "timestamptz" if t.tz is not None else "timestamp"
    if pa.types.is_decimal128(t):
        return f"decimal({t.precision}, {t.scale})"
    raise InvalidUsageError(f"column {column!r} has type {t}, which the Iceberg view does not map; supported: "
                            f"{SUPPORTED}", value=f"{column}: {t}")


def iceberg_schema(entry: SchemaEntry) -> Schema:
    """The Iceberg schema of shard schema ``entry`` (same id)."""
    arrow = sc.entry_schema(entry)
    user = tuple(Field(f.id, a.name, not a.nullable, iceberg_type(a.type, column=a.name))
                 for f, a in zip(entry.fields, arrow, strict=True))
    return Schema(entry.id, (*user, Field(TIME_ID, TIME, True, "long"), Field(DIFF_ID, DIFF, False, "long")))


def check_mappable(header: Header) -> None:
    """Refuse (InvalidUsageError) a shard with a column type the view cannot map, in any schema."""
    for e in sc.history(header):
        iceberg_schema(e)


def name_mapping(header: Header) -> str:
    """``schema.name-mapping.default``: each field id with every name it has had (a name once)."""
    names: dict[int, list[str]] = {}
    taken: set[str] = set()
    for e in sc.history(header):
        for f in e.fields:
            if f.name not in taken:
                taken.add(f.name)
                names.setdefault(f.id, []).append(f.name)
    mapping: list[dict[str, Any]] = [{"field-id": i, "names": n} for i, n in sorted(names.items())]
    mapping += [{"field-id": TIME_ID, "names": [TIME]}, {"field-id": DIFF_ID, "names": [DIFF]}]
    return msgspec.json.encode(mapping).decode()


def field_ids(entry: SchemaEntry) -> dict[str, int]:
    """Parquet column name → field id of parts written with schema ``entry`` (``_time``, ``_diff`` too)."""
    return {**{f.name: f.id for f in entry.fields}, TIME: TIME_ID, DIFF: DIFF_ID}
