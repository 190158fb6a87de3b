"""Updates tables: the reserved column names and the checks an updates table passes.

An *updates table* has the shard's user columns plus ``_time`` (int64 ms) and
``_diff`` (int64, non-zero). :func:`validate_updates` conforms an input to a shard
schema (float columns written canonically, see :mod:`shardsink.core.floats`) or raises
InvalidUsageError naming the bad column or value; :func:`check_schema` refuses a shard
schema that cannot be stored or read, :func:`check_name` a new column name. Pure: no I/O.

Column names are compared exactly, but a schema never holds two names equal ignoring case
(Unicode case folding, :func:`folded`): DuckDB resolves identifiers ignoring case and Spark
does by default, so neither could tell such columns apart (Delta refuses them too). Any
other printable name is taken as it is (``*``, ``^a.*$``, dots, spaces): every reader
selects columns by their literal name, never as a pattern or a path.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core import floats as fl
from shardsink.errors import InvalidUsageError

TIME = "_time"
DIFF = "_diff"
COUNT = "_count"
RESERVED = (TIME, DIFF)
_INT64 = pa.int64()
#: A Python int, not ``pa.scalar``: converting a Python value makes pyarrow import pandas, and at
#: import time that put pandas (0.4 CPU-s) into every process importing shardsink, such as each
#: ``shardsink inspect``.
_ZERO = 0
#: The longest new column name, in characters.
NAME_LIMIT = 256


def folded(name: str) -> str:
    """``name`` as compared ignoring case (two names with equal foldings cannot share a schema)."""
    return name.casefold()


def _reserved(name: str) -> bool:
    return folded(name) in (TIME, DIFF, COUNT)


def check_name(name: object) -> str:
    """A new column name: 1 to :data:`NAME_LIMIT` printable characters and not one of ours
    (``_time``, ``_diff``, ``_count``, in any case); else InvalidUsageError naming it."""
    if not isinstance(name, str) or not name or len(name) > NAME_LIMIT or not name.isprintable():
        raise InvalidUsageError(f"column name {name!r:.120} is invalid; expected 1-{NAME_LIMIT} printable characters",
                                value=str(name)[:120])
    if _reserved(name):
        raise InvalidUsageError(f"column name {name!r} is reserved ({TIME}, {DIFF} and {COUNT} are shardsink's, "
                                "in any case)", value=name)
    return name


def user_schema(table_schema: pa.Schema) -> pa.Schema:
    """The user columns of a table or file schema (everything but ``_time``/``_diff``)."""
    return pa.schema([f for f in table_schema if f.name not in RESERVED and f.name != COUNT])


def check_schema(schema: pa.Schema, *, what: str) -> None:
    """Refuse a shard schema with no columns, reserved names (in any case), duplicate names or
    names equal ignoring case (module docstring), or nested types. Applied to a new shard's
    schema and to the schema after every change (:func:`shardsink.core.schema.evolve`)."""
    if len(schema) == 0:
        raise InvalidUsageError(f"{what} has no user columns; a shard needs at least one")
    names = [f.name for f in schema]
    reserved = [n for n in names if _reserved(n)]
    if reserved:
        raise InvalidUsageError(f"{what} uses reserved column names {reserved}; {TIME}, {DIFF} and {COUNT} are ours, "
                                "in any case")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidUsageError(f"{what} has duplicate column names {dup}")
    seen: dict[str, str] = {}
    for n in names:
        if (twin := seen.setdefault(folded(n), n)) != n:
            raise InvalidUsageError(f"{what} has columns {twin!r} and {n!r}, equal ignoring case: DuckDB and Spark "
                                    "resolve column names ignoring case and could not tell them apart; use another "
                                    "name, or rename or drop one of them", value=n)
    bad = [f"{f.name}: {f.type}" for f in schema if pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type)]
    if bad:
        raise InvalidUsageError(f"{what} has columns of unsupported types {bad}; expected flat scalar types")


def null_error(name: str, nulls: int) -> InvalidUsageError:
    """The refusal of an input whose column ``name`` (``_time``, ``_diff``, or a user column the
    shard declares required) has ``nulls`` null values."""
    why = {TIME: "; times must be set", DIFF: ""}.get(
        name, "; the shard's schema declares it required (not nullable): set every value, or make it nullable "
              f"first (shardsink schema URL --nullable {name})")
    return InvalidUsageError(f"column {name!r} has {nulls} null values{why}", value=name)


def _conform_column(col: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
    """``col`` as ``field``'s type, or InvalidUsageError (an incompatible type, a value that does
    not fit, a null in a required column)."""
    out = col if col.type == field.type else _cast_column(col, field)
    if not field.nullable and out.null_count:
        raise null_error(field.name, out.null_count)
    return out


def _cast_column(col: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
    ok = (
        pa.types.is_null(col.type)
        or (pa.types.is_integer(col.type) and pa.types.is_integer(field.type))
        or (pa.types.is_floating(col.type) and pa.types.is_floating(field.type))
        or (pa.types.is_string(col.type) and pa.types.is_large_string(field.type))
        or (pa.types.is_large_string(col.type) and pa.types.is_string(field.type))
    )
    if not ok:
        raise InvalidUsageError(f"column {field.name!r} has type {col.type}; the shard expects {field.type}")
    try:
        return col.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidUsageError(f"column {field.name!r} does not fit the shard's type {field.type}: {e}") from e


def _as_int64(col: pa.ChunkedArray, name: str, what: str) -> pa.ChunkedArray:
    """``col`` cast to int64, or InvalidUsageError naming the column (non-integer or out of range)."""
    if not pa.types.is_integer(col.type):
        raise InvalidUsageError(f"column {name!r} has type {col.type}; expected {what}")
    if col.type == _INT64:
        return col  # what the cast would return (the same values), without a compute call
    try:
        return col.cast(pa.int64())
    except pa.ArrowInvalid as e:
        raise InvalidUsageError(f"column {name!r} has values outside int64: {e}") from e


def validate_updates(table: pa.Table, schema: pa.Schema, *, lower: int, upper: int | None) -> pa.Table:
    """Return ``table`` conformed to ``schema`` + ``_time``/``_diff``, or raise InvalidUsageError.

    Refuses: missing or extra columns, incompatible types, nulls in a column ``schema``
    declares required, null or out-of-bounds times, null or zero diffs. ``_diff`` defaults
    to 1 when absent. ``upper=None`` is unbounded.
    """
    given = table.column_names  # a new list each time it is asked for
    names = set(given)
    if len(names) < len(given):
        dup = sorted({n for n in given if given.count(n) > 1})
        raise InvalidUsageError(f"input has duplicate columns {dup}; expected each column once")
    expected = [f.name for f in schema]
    missing = [n for n in expected if n not in names]
    extra = sorted(names - set(expected) - set(RESERVED))
    if missing or extra:
        raise InvalidUsageError(
            f"input columns do not match the shard schema: missing {missing}, unexpected {extra} "
            f"(expected {expected} plus {TIME!r} and optionally {DIFF!r})"
        )
    if TIME not in names:
        raise InvalidUsageError(f"input has no {TIME!r} column (int64 milliseconds since the epoch)")
    n = table.num_rows
    # Canonical floats (-0.0 as 0.0, one NaN): see shardsink.core.floats for why and where.
    cols = [fl.canonical_array(_conform_column(table.column(f.name), f)) for f in schema]
    time = _as_int64(table.column(TIME), TIME, "int64 milliseconds")
    if time.null_count:
        raise null_error(TIME, time.null_count)
    if DIFF in names:
        diff = _as_int64(table.column(DIFF), DIFF, "int64")
        if diff.null_count:
            raise null_error(DIFF, diff.null_count)
        # one kernel when there is no zero (the usual case); counted only for the message
        if n and pc.index(diff, _ZERO).as_py() >= 0:
            zeros = n - pc.count(pc.filter(diff, pc.not_equal(diff, 0))).as_py()
            raise InvalidUsageError(f"column {DIFF!r} has {zeros} zero values; diffs must be non-zero")
    else:
        diff = pa.chunked_array([pa.repeat(pa.scalar(1, pa.int64()), n)])
    if n:
        mm = pc.min_max(time)
        tmin, tmax = mm["min"].as_py(), mm["max"].as_py()
        if tmin < lower or (upper is not None and tmax >= upper):
            raise InvalidUsageError(
                f"times [{tmin}, {tmax}] fall outside the batch bounds [{lower}, {upper}); "
                "every _time must satisfy lower <= _time < upper"
            )
    out_schema = pa.schema([*schema, pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)])
    return pa.Table.from_arrays([*cols, time, diff], schema=out_schema)
