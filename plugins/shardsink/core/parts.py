"""Updates as Arrow tables: validation, consolidation, and Parquet parts.

An *updates table* has the shard's user columns plus ``_time`` (int64 ms) and
``_diff`` (int64, non-zero). A part holds a consolidated slice of one: at most one row
per distinct ``(row, _time)``, no zero diffs, sorted by the user columns then time.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import floats as fl
from shardsink.core.state import PartMeta
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.storage.base import Blob

try:  # numpy is optional for pyarrow; without it sorting falls back to pc.sort_indices
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]

TIME = "_time"
DIFF = "_diff"
COUNT = "_count"
RESERVED = (TIME, DIFF)
#: Target in-memory size of one part; Parquet compresses it to a fraction of that.
TARGET_PART_BYTES = 128 * 1024 * 1024
#: Inputs at least this large are staged in parallel slices (see stage_parts).
PARALLEL_STAGE_ROWS = 1 << 18
#: How parts are encoded (see :func:`write_parts`).
PartEncoding = Literal["default", "compact"]


def user_schema(table_schema: pa.Schema) -> pa.Schema:
    """The user columns of a table or file schema (everything but ``_time``/``_diff``)."""
    return pa.schema([f for f in table_schema if f.name not in RESERVED and f.name != COUNT])


def check_schema(schema: pa.Schema, *, what: str) -> None:
    """Refuse a shard schema with no columns, duplicate or reserved names, or nested types."""
    if len(schema) == 0:
        raise InvalidUsageError(f"{what} has no user columns; a shard needs at least one")
    names = [f.name for f in schema]
    reserved = [n for n in names if n in (*RESERVED, COUNT)]
    if reserved:
        raise InvalidUsageError(f"{what} uses reserved column names {reserved}; {TIME}, {DIFF} and {COUNT} are ours")
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


def _as_int64(col: pa.ChunkedArray, name: str, what: str) -> pa.ChunkedArray:
    """``col`` cast to int64, or InvalidUsageError naming the column (non-integer or out of range)."""
    if not pa.types.is_integer(col.type):
        raise InvalidUsageError(f"column {name!r} has type {col.type}; expected {what}")
    try:
        return col.cast(pa.int64())
    except pa.ArrowInvalid as e:
        raise InvalidUsageError(f"column {name!r} has values outside int64: {e}") from e


def validate_updates(table: pa.Table, schema: pa.Schema, *, lower: int, upper: int | None) -> pa.Table:
    """Return ``table`` conformed to ``schema`` + ``_time``/``_diff``, or raise InvalidUsageError.

    Refuses: missing or extra columns, incompatible types, null or out-of-bounds times,
    null or zero diffs. ``_diff`` defaults to 1 when absent. ``upper=None`` is unbounded.
    """
    dup = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
    if dup:
        raise InvalidUsageError(f"input has duplicate columns {dup}; expected each column once")
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
    # Canonical floats (-0.0 as 0.0, one NaN): see shardsink.core.floats for why and where.
    cols = [fl.canonical_array(_conform_column(table.column(f.name), f)) for f in schema]
    time = _as_int64(table.column(TIME), TIME, "int64 milliseconds")
    if time.null_count:
        raise InvalidUsageError(f"column {TIME!r} has {time.null_count} null values; times must be set")
    if DIFF in names:
        diff = _as_int64(table.column(DIFF), DIFF, "int64")
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

    Sorts, then sums runs of equal adjacent keys (a segmented sum keeps the sorted
    order; a hash group-by would not). Skips the summing when no two adjacent sorted
    rows share their keys, the common case for ingested data.
    """
    if table.num_rows == 0:
        return table
    fast = _sort_order(table, keys)
    if fast is None:
        order, maybe_duplicates = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys]), True
    else:
        order, maybe_duplicates = fast
    table = _take(table, order)
    if table.num_rows == 1 or not maybe_duplicates:
        return table
    same = _adjacent_same(table, keys)
    if same is None:
        return table
    return _sum_runs(table, same, keys)


def _sum_runs(table: pa.Table, same: Any, keys: Sequence[str]) -> pa.Table:
    """Sum ``_diff`` over runs of rows where ``same[i]`` (row i equals row i+1); drop zeros."""
    if np is None:  # pragma: no cover - numpy ships with every supported install
        summed = table.group_by(list(keys), use_threads=False).aggregate([(DIFF, "sum")])
        summed = summed.rename_columns([*keys, DIFF]).select(table.column_names)
        summed = summed.take(pc.sort_indices(summed, sort_keys=[(k, "ascending", "at_end") for k in keys]))
    else:
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        sums = np.add.reduceat(table.column(DIFF).to_numpy(), starts)
        summed = table.take(pa.array(starts)).set_column(
            table.schema.get_field_index(DIFF), table.schema.field(DIFF), pa.array(sums, pa.int64())
        )
    return summed.filter(pc.not_equal(summed[DIFF], 0))


# --- sorting ---------------------------------------------------------------------------
#
# ``pc.sort_indices`` over several keys costs ~0.2 s per million rows (it compares row by
# row, column by column). Instead each key column is mapped to order-preserving integer
# codes (nulls last, like ``null_placement="at_end"``), the codes are combined in mixed
# radix into one uint64 per row, and numpy's vectorised sort orders them. When the next
# key's codes would overflow 64 bits, the rows are sorted by the prefix so far; the few
# rows it leaves tied are sorted by the later keys on their own (:func:`_resolve_ties`),
# and only many ties fold the later keys in after replacing the prefix by its dense rank.
# The row index rides in the low bits, so the sort is stable and the order
# is exactly that of ``pc.sort_indices(..., null_placement="at_end")``. Key types without
# a coding here (decimals, views, ...) and a missing numpy fall back to pc.sort_indices.

_U64 = 1 << 64


def _dense(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ranks of ``codes`` (uint64) and how many distinct values there are."""
    uniq, inverse = np.unique(codes, return_inverse=True)
    return inverse.astype(np.uint64, copy=False).reshape(-1), len(uniq)


def _with_nulls(codes: np.ndarray, bound: int, arr: pa.Array) -> tuple[np.ndarray, int]:
    """Give null slots the code ``bound`` (sorting after every value)."""
    if arr.null_count == 0:
        return codes, bound
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    return np.where(valid, codes, np.uint64(bound)), bound + 1


def _ordered_float_bits(values: np.ndarray) -> np.ndarray:
    """uint64 keys ordered like the floats, with -0.0 == 0.0 and every NaN equal and last."""
    values = values.astype(np.float64) + 0.0  # a copy; -0.0 + 0.0 == 0.0
    values[np.isnan(values)] = np.nan
    bits = values.view(np.uint64)
    return np.where(bits >> np.uint64(63), ~bits, bits | np.uint64(1 << 63))


def _ranked_dictionary(arr: pa.Array, rank_of: Callable[[pa.Array], tuple[np.ndarray, int]],
                       enc: pa.DictionaryArray | None = None) -> tuple[np.ndarray, int]:
    """Codes via a hash dictionary: rank the distinct values only, then gather per row."""
    enc = arr.dictionary_encode() if enc is None else enc
    if len(enc.dictionary) == 0:  # all null
        return np.zeros(len(arr), np.uint64), 1
    rank, bound = rank_of(enc.dictionary)
    return _with_nulls(rank[pc.fill_null(enc.indices, 0).to_numpy()], bound, arr)


def _sorted_rank(dictionary: pa.Array) -> tuple[np.ndarray, int]:
    rank = np.empty(len(dictionary), np.uint64)
    rank[pc.sort_indices(dictionary).to_numpy()] = np.arange(len(dictionary), dtype=np.uint64)
    return rank, len(dictionary)


def _float_rank(dictionary: pa.Array) -> tuple[np.ndarray, int]:
    return _dense(_ordered_float_bits(dictionary.to_numpy(zero_copy_only=False)))


def _int_rank(dictionary: pa.Array) -> tuple[np.ndarray, int]:
    return _dense(dictionary.to_numpy())


def _key_codes(arr: pa.Array) -> tuple[np.ndarray, int] | None:
    """Order-preserving codes in ``[0, bound)`` for one key column, or None if unsupported.

    Equal codes mean equal values (with -0.0 == 0.0 and all NaNs equal, as Arrow's sort
    compares them); NaN sorts after every number, null after everything.
    """
    t = arr.type
    n = len(arr)
    if pa.types.is_temporal(t) and not pa.types.is_interval(t):
        t = pa.int32() if t.bit_width == 32 else pa.int64()
        arr = arr.view(t)
    if pa.types.is_integer(t):
        mm = pc.min_max(arr)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is None:  # all null
            return np.zeros(n, np.uint64), 1
        if hi - lo >= 1 << 40:  # sparse values: rank the distinct ones
            return _ranked_dictionary(arr, _int_rank)
        codes = pc.fill_null(arr, lo).to_numpy().astype(np.uint64) - np.uint64(lo % _U64)
        return _with_nulls(codes, hi - lo + 1, arr)
    if pa.types.is_floating(t):
        enc = arr.dictionary_encode()
        if len(enc.dictionary) > n // 2:  # mostly distinct: ranking every row directly is cheaper
            codes, bound = _dense(_ordered_float_bits(pc.fill_null(arr, 0.0).to_numpy()))
            return _with_nulls(codes, bound, arr)
        return _ranked_dictionary(arr, _float_rank, enc)
    if pa.types.is_boolean(t):
        codes = pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(np.uint64)
        return _with_nulls(codes, 2, arr)
    if t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        return _ranked_dictionary(arr, _sorted_rank)
    if pa.types.is_dictionary(t) and t.value_type in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        return _ranked_dictionary(arr, _sorted_rank, arr)  # staging's encoded strings (_stage_slice)
    return None


def _take(table: pa.Table, order: pa.Array) -> pa.Table:
    """``table.take(order)``, without copying when the table is already in order."""
    in_order = (np is not None and table.num_rows > 1 and isinstance(order, pa.Int64Array)
                and order.null_count == 0 and bool(np.all(np.diff(order.to_numpy()) == 1)))
    return table if in_order else table.take(order)


def _sort_order(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Array, bool] | None:
    """Indices sorting ``table`` ascending by ``keys`` (nulls last), and whether equal keys may
    be adjacent (False proves there are no duplicates); None if a key type is unsupported."""
    n = table.num_rows
    if np is None or n >= 1 << 32:
        return None
    if n <= 1:
        return pa.array(np.arange(n, dtype=np.int64)), False
    got = _order_by(None, [_one_array(table.column(k)) for k in keys])
    return None if got is None else (pa.array(got[0]), got[1])


def _order_by(lead: tuple[np.ndarray, int] | None, cols: Sequence[pa.Array]) -> tuple[np.ndarray, bool] | None:
    """Row order (int64, stable) by ``lead`` codes (if given) then ``cols``; and whether ties remain.

    One vectorised sort of as many leading keys as fit beside the row index. If that
    leaves ties, and they are few (typical of ingested data: a wide prefix tells almost
    every row apart), only the tied rows are gathered and sorted by their tie group and
    the remaining keys (recursively), and put back in their groups' positions: the codes
    of later keys are never computed for the other rows. Many ties fall back to dense
    ranks of the prefix, folded with the next keys (no second sort of the prefix).
    """
    n = len(cols[0]) if cols else len(lead[0]) if lead is not None else 0
    idx_bits = max(1, (n - 1).bit_length())
    limit = 1 << (64 - idx_bits)  # codes below this fit beside a row index in a uint64
    acc, acc_bound = lead if lead is not None else (None, 1)
    for i, col in enumerate(cols):
        got = _key_codes(col)
        if got is None:
            return None
        codes, bound = got
        if acc is None:
            acc, acc_bound = codes, bound
            continue
        if acc_bound * bound > limit:
            if acc_bound > limit:
                acc, acc_bound = _dense(acc)
            packed = _packed_sort(acc, idx_bits)
            sorted_codes = packed >> np.uint64(idx_bits)
            ties = sorted_codes[1:] == sorted_codes[:-1]
            order = _order_of(packed, idx_bits)
            if not ties.any():
                return order, False  # rows all differ already
            tied = np.zeros(n, bool)
            tied[1:] = ties
            tied[:-1] |= ties
            pos = np.flatnonzero(tied)
            if len(pos) * 4 <= n:
                return _resolve_ties(order, pos, ties, cols[i:])
            acc, acc_bound = _ranks(order, ties)
            if acc_bound * bound > _U64:
                codes, bound = _dense(codes)  # both now < 2**32: the product fits
        acc = acc * np.uint64(bound) + codes
        acc_bound *= bound
    assert acc is not None
    if acc_bound > limit:
        acc, acc_bound = _dense(acc)  # < 2**32 values: fits beside a 32-bit row index
    packed = _packed_sort(acc, idx_bits)
    # Equal codes are a superset of equal keys (pc.equal never matches NaN), so no equal
    # adjacent codes proves no adjacent duplicates.
    sorted_codes = packed >> np.uint64(idx_bits)
    maybe_duplicates = bool(np.any(sorted_codes[1:] == sorted_codes[:-1]))
    return _order_of(packed, idx_bits), maybe_duplicates


def _resolve_ties(order: np.ndarray, pos: np.ndarray, ties: np.ndarray,
                  rest: Sequence[pa.Array]) -> tuple[np.ndarray, bool] | None:
    """``order`` (sorted by a prefix of the keys; ``ties[j]``: sorted rows j, j+1 tie on it) with
    the tied rows at sorted positions ``pos`` reordered by the ``rest`` of the keys.

    Each run of tied rows keeps its positions; within it the rows are sorted by ``rest``,
    stably: ``order`` lists a run's rows by ascending row index (the packed sort is
    stable), and so does the gathered sub-table, so full ties keep input order.
    """
    starts = np.ones(len(pos), bool)
    inner = pos > 0
    starts[inner] = ~ties[pos[inner] - 1]
    group = np.cumsum(starts, dtype=np.uint64) - np.uint64(1)
    rows = order[pos]
    take = pa.array(rows)
    sub = _order_by((group, int(group[-1]) + 1), [col.take(take) for col in rest])
    if sub is None:
        return None
    order = order.copy()
    order[pos] = rows[sub[0]]
    return order, sub[1]


def _one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one array (no copy when it has a single chunk)."""
    if not isinstance(col, pa.ChunkedArray):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _packed_sort(codes: np.ndarray, idx_bits: int) -> np.ndarray:
    """``codes << idx_bits | row`` sorted: a plain (vectorised) value sort that is stable,
    ties kept in input order exactly like pc.sort_indices."""
    packed = (codes << np.uint64(idx_bits)) | np.arange(len(codes), dtype=np.uint64)
    packed.sort()
    return packed


def _order_of(packed: np.ndarray, idx_bits: int) -> np.ndarray:
    """The row indices of a packed sort, as int64 (masks ``packed`` in place: the codes are gone)."""
    np.bitwise_and(packed, np.uint64((1 << idx_bits) - 1), out=packed)
    return packed.view(np.int64)


def _ranks(order: np.ndarray, ties: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ranks per row (in input order) from a sort's row order and its adjacent-tie mask."""
    sorted_ranks = np.concatenate(([0], np.cumsum(~ties, dtype=np.uint64)))
    ranks = np.empty(len(order), np.uint64)
    ranks[order] = sorted_ranks
    return ranks, int(sorted_ranks[-1]) + 1


def _adjacent_same(table: pa.Table, keys: Sequence[str]) -> Any:
    """Mask ``m`` with ``m[i]`` = rows i and i+1 agree on every key; None if none do.

    Nulls equal nulls and NaN equals NaN here, as rows are compared by group_by.
    """
    n = table.num_rows
    same: pa.Array | None = None
    for k in keys:
        col = table.column(k)
        if pa.types.is_dictionary(col.type):
            # staging's encoded strings (_stage_slice): one dictionary of distinct values,
            # so equal indices are equal values (and null indices null values)
            col = _one_array(col).indices
        a, b = col.slice(0, n - 1), col.slice(1, n - 1)
        eq = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        if pa.types.is_floating(col.type):
            eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
        same = eq if same is None else pc.and_(same, eq)
        if not pc.any(same).as_py():
            return None
    if same is None:
        return None
    return same.to_numpy(zero_copy_only=False) if np is not None else same


def stage_parts(
    blob: Blob,
    updates: pa.Table,
    keys: Sequence[str],
    *,
    prefix: str,
    target_bytes: int = TARGET_PART_BYTES,
    encoding: PartEncoding = "default",
    threads: int | None = None,
) -> tuple[PartMeta, ...]:
    """Consolidate and write validated ``updates``; large inputs use every core.

    An input of at least :data:`PARALLEL_STAGE_ROWS` rows is cut into one contiguous
    slice per core (``threads``: at most that many; 1 where the caller owns one core, as a
    Spark task does), and each slice is consolidated, sorted and written as its own parts
    in a thread (Arrow and numpy release the GIL). Every part is still consolidated and
    sorted on its own; a row may appear in two parts of one batch, which every reader
    sums anyway (as it must for parts of different writers). A slice without duplicate
    keys is sorted and written with its strings dictionary-encoded (:func:`_stage_slice`).
    """
    n = updates.num_rows
    slices = max(1, min(os.cpu_count() or 1, 4, threads or 4)) if n >= PARALLEL_STAGE_ROWS else 1
    step = -(-n // slices) if n else 1

    def one(i: int) -> tuple[PartMeta, ...]:
        return _stage_slice(blob, updates.slice(i, step), keys, prefix=prefix, target_bytes=target_bytes,
                            encoding=encoding)

    if slices == 1:
        return one(0)
    with ThreadPoolExecutor(max_workers=slices) as pool:
        return tuple(p for parts in pool.map(one, range(0, n, step)) for p in parts)


def _stage_slice(blob: Blob, piece: pa.Table, keys: Sequence[str], *, prefix: str, target_bytes: int,
                 encoding: PartEncoding) -> tuple[PartMeta, ...]:
    """Consolidate and write one slice of :func:`stage_parts`.

    Fast path (default encoding, a schema Parquet keeps without Arrow's schema note, see
    :func:`_plain_parquet_schema`): string columns are dictionary-encoded once; the sort
    ranks their dictionaries, the sorted copy gathers integer indices instead of strings,
    duplicates are summed on the encoded table (equal indices are equal strings), and the
    writer takes the dictionaries as they are instead of hashing every value again. The
    file is the same plain Parquet (dictionary pages for those columns, as before) and
    reads back as the same plain table.
    Anything else goes through :func:`consolidate` and :func:`write_parts`.
    """
    if encoding == "default" and piece.num_rows > 1 and _plain_parquet_schema(piece.schema):
        encoded = _strings_encoded(piece)
        fast = _sort_order(encoded, keys) if encoded is not None else None
        if encoded is not None and fast is not None:
            ordered = _take(encoded, fast[0])
            same = _adjacent_same(ordered, keys) if fast[1] else None  # None: no duplicates to sum
            if same is not None:
                ordered = _sum_runs(ordered, same, keys)
            per_row = max(1, piece.nbytes // piece.num_rows)  # part sizes as for the plain table
            return _write_slices(blob, ordered, prefix=prefix, rows_per_part=max(1, target_bytes // per_row),
                                 write=_write_encoded)
    return write_parts(blob, consolidate(piece, keys), prefix=prefix, target_bytes=target_bytes, encoding=encoding)


def _strings_encoded(table: pa.Table) -> pa.Table | None:
    """``table`` with every string/binary column dictionary-encoded (one chunk each), or None if it has none."""
    fields, cols, any_string = [], [], False
    for f, col in zip(table.schema, table.columns, strict=True):
        if f.type in (pa.string(), pa.binary()):
            col = _one_array(col).dictionary_encode()
            f = pa.field(f.name, col.type, f.nullable)
            any_string = True
        fields.append(f)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields)) if any_string else None


def _write_encoded(table: pa.Table, buf: io.BytesIO) -> None:
    pq.write_table(table, buf, store_schema=False, **_default_options(table))


_PLAIN: dict[bytes, bool] = {}


def _plain_parquet_schema(schema: pa.Schema) -> bool:
    """Whether a Parquet file of ``schema`` written without Arrow's stored schema reads back
    as exactly ``schema`` (e.g. not for large_string or non-UTC time zones). Cached."""
    key = schema.serialize().to_pybytes()
    if key not in _PLAIN:
        buf = io.BytesIO()
        pq.write_table(schema.empty_table(), buf, store_schema=False)
        _PLAIN[key] = pq.read_schema(pa.BufferReader(buf.getvalue())).equals(schema)
    return _PLAIN[key]


def write_parts(
    blob: Blob,
    table: pa.Table,
    *,
    prefix: str,
    target_bytes: int = TARGET_PART_BYTES,
    encoding: PartEncoding = "default",
) -> tuple[PartMeta, ...]:
    """Write a consolidated updates table as parts under ``prefix/`` (fresh unique keys).

    ``encoding="compact"`` (for small, sparse sets of updates such as a view's
    correction): zstd, and a dictionary only for columns with few distinct values
    (``<= rows / 4``); dictionaries of mostly-unique columns cost more than they save
    in small parts. Readers need nothing special: both are plain Parquet.
    """
    if table.num_rows == 0:
        return ()
    per_row = max(1, table.nbytes // max(1, table.num_rows))

    def write(piece: pa.Table, buf: io.BytesIO) -> None:
        if encoding == "compact":
            few = [c for c in piece.column_names if pc.count_distinct(piece[c]).as_py() * 4 <= piece.num_rows]
            pq.write_table(piece, buf, compression="zstd", use_dictionary=few)
        else:
            pq.write_table(piece, buf, **_default_options(piece))

    return _write_slices(blob, table, prefix=prefix, rows_per_part=max(1, target_bytes // per_row), write=write)


def _write_slices(blob: Blob, table: pa.Table, *, prefix: str, rows_per_part: int,
                  write: Callable[[pa.Table, io.BytesIO], None]) -> tuple[PartMeta, ...]:
    """Write ``table`` (consolidated, sorted) as parts of ``rows_per_part`` rows, in parallel."""
    if table.num_rows == 0:
        return ()
    slices = [table.slice(i, rows_per_part) for i in range(0, table.num_rows, rows_per_part)]

    def one(piece: pa.Table) -> PartMeta:
        buf = io.BytesIO()
        write(piece, buf)
        data = buf.getvalue()
        key = f"{prefix}/{uuid.uuid4().hex}.parquet"
        blob.put(key, data)
        mm = pc.min_max(piece[TIME])
        return PartMeta(key, piece.num_rows, len(data), mm["min"].as_py(), mm["max"].as_py())

    if len(slices) == 1:
        return (one(slices[0]),)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return tuple(pool.map(one, slices))


def _default_options(table: pa.Table) -> dict[str, Any]:
    """Parquet options of a default part. Statistics only for the first key, ``_time`` and
    ``_diff``: a part is sorted by the keys, so only those ranges are selective (readers
    prune by time; min/max of the other columns would span nearly their whole domain),
    and computing them is a fifth of the write. ``_diff``'s range lets a scan for
    retractions (``_diff < 0``) skip row groups of insertions unread. No dictionary for ``_time``: event times are
    mostly distinct, and a dictionary the writer builds then abandons costs time and bytes.
    """
    first = table.column_names[0]
    return {"write_statistics": list(dict.fromkeys([first, TIME, DIFF])),
            "use_dictionary": [c for c in table.column_names if c != TIME]}


def open_part(blob: Blob, p: PartMeta, *, referenced_by: str = "the shard state") -> pq.ParquetFile:
    """The part as a Parquet file, or CorruptionError if it is missing, unreadable or has
    another row count than the state records."""
    got = blob.get(p.key)
    if got is None:
        raise CorruptionError(f"part {blob.url}/{p.key} is missing (referenced by {referenced_by})")
    try:
        f = pq.ParquetFile(pa.BufferReader(got.data))
    except Exception as e:
        raise CorruptionError(f"part {blob.url}/{p.key} is unreadable: {type(e).__name__}: {e}") from e
    if f.metadata.num_rows != p.rows:
        raise CorruptionError(f"part {blob.url}/{p.key} has {f.metadata.num_rows} rows; the state says {p.rows}")
    return f


def read_parts(blob: Blob, parts: Sequence[PartMeta], schema: pa.Schema) -> pa.Table:
    """Read parts in parallel; CorruptionError names any missing or unreadable part."""
    full = pa.schema([*schema, pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)])

    def one(p: PartMeta) -> pa.Table:
        f = open_part(blob, p)
        try:
            t = f.read()
        except Exception as e:
            raise CorruptionError(f"part {blob.url}/{p.key} is unreadable: {type(e).__name__}: {e}") from e
        try:
            t = t.select(full.names).cast(full)
        except Exception as e:
            raise CorruptionError(f"part {blob.url}/{p.key} does not match the shard schema: {e}") from e
        return fl.canonical_table(t)  # parts written before canonical floats, or by another writer

    if not parts:
        return full.empty_table()
    if len(parts) == 1:
        return one(parts[0])
    with ThreadPoolExecutor(max_workers=8) as pool:
        return pa.concat_tables(list(pool.map(one, parts)))
