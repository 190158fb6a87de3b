"""Updates as Arrow tables: validation, consolidation, and Parquet parts.

An *updates table* has the shard's user columns plus ``_time`` (int64 ms) and
``_diff`` (int64, non-zero). A part holds a consolidated slice of one: at most one row
per distinct ``(row, _time)``, no zero diffs, sorted by the user columns then time.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core.state import PartMeta
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.storage.base import Blob

TIME = "_time"
DIFF = "_diff"
COUNT = "_count"
RESERVED = (TIME, DIFF)
#: Target in-memory size of one part; Parquet compresses it to a fraction of that.
TARGET_PART_BYTES = 128 * 1024 * 1024


def user_schema(table_schema: pa.Schema) -> pa.Schema:
    """The user columns of a table or file schema (everything but ``_time``/``_diff``)."""
    return pa.schema([f for f in table_schema if f.name not in RESERVED and f.name != COUNT])


def check_schema(schema: pa.Schema, *, what: str) -> None:
    if len(schema) == 0:
        raise InvalidUsageError(f"{what} has no user columns; a shard needs at least one")
    names = [f.name for f in schema]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidUsageError(f"{what} has duplicate column names {dup}")
    bad = [f"{f.name}: {f.type}" for f in schema if pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type)]
    if bad:
        raise InvalidUsageError(f"{what} has columns of unsupported types {bad}; expected flat scalar types")


def _conform_column(col: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
    if col.type == field.type:
        return col
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


def validate_updates(table: pa.Table, schema: pa.Schema, *, lower: int, upper: int | None) -> pa.Table:
    """Return ``table`` conformed to ``schema`` + ``_time``/``_diff``, or raise InvalidUsageError.

    Refuses: missing or extra columns, incompatible types, null or out-of-bounds times,
    null or zero diffs. ``_diff`` defaults to 1 when absent. ``upper=None`` is unbounded.
    """
    names = set(table.column_names)
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
    cols = [_conform_column(table.column(f.name), f) for f in schema]
    time = table.column(TIME)
    if not pa.types.is_integer(time.type):
        raise InvalidUsageError(f"column {TIME!r} has type {time.type}; expected int64 milliseconds")
    time = time.cast(pa.int64())
    if time.null_count:
        raise InvalidUsageError(f"column {TIME!r} has {time.null_count} null values; times must be set")
    if DIFF in names:
        diff = table.column(DIFF)
        if not pa.types.is_integer(diff.type):
            raise InvalidUsageError(f"column {DIFF!r} has type {diff.type}; expected int64")
        diff = diff.cast(pa.int64())
        if diff.null_count:
            raise InvalidUsageError(f"column {DIFF!r} has {diff.null_count} null values")
        zeros = n - pc.count(pc.filter(diff, pc.not_equal(diff, 0))).as_py() if n else 0
        if zeros:
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


def consolidate(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Sum ``_diff`` per distinct ``keys``, drop zero sums, sort by ``keys``.

    Skips the hash aggregation when the sorted input has no adjacent duplicate keys,
    the common case for ingested data.
    """
    if table.num_rows == 0:
        return table
    order = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys])
    table = table.take(order)
    if table.num_rows > 1 and not _has_adjacent_duplicates(table, keys):
        return table
    summed = table.group_by(list(keys), use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.rename_columns([*keys, DIFF])
    summed = summed.filter(pc.not_equal(summed[DIFF], 0))
    return summed.select([*table.column_names])


def _has_adjacent_duplicates(table: pa.Table, keys: Sequence[str]) -> bool:
    n = table.num_rows
    same: pa.Array | None = None
    for k in keys:
        col = table.column(k)
        a, b = col.slice(0, n - 1), col.slice(1, n - 1)
        eq = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        eq = pc.or_(eq, both_null)
        same = eq if same is None else pc.and_(same, eq)
        if not pc.any(same).as_py():
            return False
    return same is not None and bool(pc.any(same).as_py())


def write_parts(
    blob: Blob,
    table: pa.Table,
    *,
    prefix: str,
    target_bytes: int = TARGET_PART_BYTES,
) -> tuple[PartMeta, ...]:
    """Write a consolidated updates table as parts under ``prefix/`` (fresh unique keys)."""
    if table.num_rows == 0:
        return ()
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    rows_per_part = max(1, target_bytes // per_row)
    slices = [table.slice(i, rows_per_part) for i in range(0, table.num_rows, rows_per_part)]

    def one(piece: pa.Table) -> PartMeta:
        buf = io.BytesIO()
        pq.write_table(piece, buf)
        data = buf.getvalue()
        key = f"{prefix}/{uuid.uuid4().hex}.parquet"
        blob.put(key, data)
        mm = pc.min_max(piece[TIME])
        return PartMeta(key, piece.num_rows, len(data), mm["min"].as_py(), mm["max"].as_py())

    if len(slices) == 1:
        return (one(slices[0]),)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return tuple(pool.map(one, slices))


def read_parts(blob: Blob, parts: Sequence[PartMeta], schema: pa.Schema) -> pa.Table:
    """Read parts in parallel; CorruptionError names any missing or unreadable part."""
    full = pa.schema([*schema, pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)])

    def one(p: PartMeta) -> pa.Table:
        got = blob.get(p.key)
        if got is None:
            raise CorruptionError(f"part {blob.url}/{p.key} is missing (referenced by the shard state)")
        try:
            t = pq.read_table(pa.BufferReader(got.data))
        except Exception as e:
            raise CorruptionError(f"part {blob.url}/{p.key} is unreadable: {type(e).__name__}: {e}") from e
        if t.num_rows != p.rows:
            raise CorruptionError(f"part {blob.url}/{p.key} has {t.num_rows} rows; the state says {p.rows}")
        try:
            return t.select(full.names).cast(full)
        except Exception as e:
            raise CorruptionError(f"part {blob.url}/{p.key} does not match the shard schema: {e}") from e

    if not parts:
        return full.empty_table()
    if len(parts) == 1:
        return one(parts[0])
    with ThreadPoolExecutor(max_workers=8) as pool:
        return pa.concat_tables(list(pool.map(one, parts)))
