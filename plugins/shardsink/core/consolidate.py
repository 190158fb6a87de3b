"""Consolidation of updates tables, and the vectorised multi-key sort it runs on.

:func:`consolidate` sums ``_diff`` per distinct key, drops zero sums and sorts by the
keys (nulls last), stably: the order is exactly that of
``pc.sort_indices(..., null_placement="at_end")``, with ``-0.0`` equal to ``0.0`` and
every NaN equal. A consolidated slice of an updates table has at most one row per
distinct ``(row, _time)`` and no zero diffs. Pure: Arrow tables in, Arrow tables out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.diff_sums import group_sums, run_sums
from shardsink.core.small_sort import small_order
from shardsink.core.updates import DIFF

try:  # numpy is optional for pyarrow; without it sorting falls back to pc.sort_indices
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]


def consolidate(table: pa.Table, keys: Sequence[str], *, where: str = "the updates") -> pa.Table:
    """Sum ``_diff`` per distinct ``keys``, drop zero sums, sort by ``keys``.

    Sums are exact (:mod:`shardsink.core.diff_sums`): CorruptionError naming ``where`` if one
    leaves int64, never a wrapped value.

    Sorts, then sums runs of equal adjacent keys (a segmented sum keeps the sorted
    order; a hash group-by would not). Skips the summing when no two adjacent sorted
    rows share their keys, the common case for ingested data.
    """
    return _consolidate(table, keys, where=where, partial=False)[0]


def consolidate_partial(table: pa.Table, keys: Sequence[str], *, where: str) -> tuple[pa.Table, bool]:
    """:func:`consolidate` of a CHUNK of some updates (more rows of a key may be in other
    chunks, consolidated together later): a key whose exact sum in this chunk leaves int64 is
    no error (its total may not), its rows are kept unsummed instead (still sorted; the sums
    stay exact). Returns the table and whether it is fully consolidated (no such key)."""
    return _consolidate(table, keys, where=where, partial=True)


def _consolidate(table: pa.Table, keys: Sequence[str], *, where: str, partial: bool) -> tuple[pa.Table, bool]:
    if table.num_rows == 0:
        return table, True
    fast = _consolidate_fast(table, keys, where=where, partial=partial)
    if fast is not None:
        return fast
    table = _take(table, pc.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys]))
    if table.num_rows == 1:
        return table, True
    same = _adjacent_same(table, keys)
    if same is None:
        return table, True
    return _sum_runs(table, same, keys, where=where, partial=partial)


def consolidate_fast(table: pa.Table, keys: Sequence[str], *, where: str = "the updates") -> pa.Table | None:
    """:func:`consolidate` by the vectorised sort alone, or None (nothing done) if a key
    type has no coding there (or numpy is missing); :func:`consolidate` then falls back
    to ``pc.sort_indices``. Also takes string keys dictionary-encoded, as staging's fast
    path encodes them (``part_io._stage_slice``).
    """
    fast = _consolidate_fast(table, keys, where=where, partial=False)
    return None if fast is None else fast[0]


def _consolidate_fast(table: pa.Table, keys: Sequence[str], *, where: str,
                      partial: bool) -> tuple[pa.Table, bool] | None:
    small = small_order(table, keys)  # a small table: the same order and mask, sorted in Python
    if small is not None:
        ordered, same = _take(table, small[0]), small[1]
    else:
        fast = _sort_order(table, keys)
        if fast is None:
            return None
        ordered = _take(table, fast[0])
        same = _adjacent_same(ordered, keys) if fast[1] else None  # None: no duplicates to sum
    if same is None:
        return ordered, True
    return _sum_runs(ordered, same, keys, where=where, partial=partial)


def _sum_runs(table: pa.Table, same: Any, keys: Sequence[str], *, where: str,
              partial: bool) -> tuple[pa.Table, bool]:
    """Sum ``_diff`` (exactly) over runs of rows where ``same[i]`` (row i equals row i+1); drop
    zeros. ``partial``: a run whose sum leaves int64 keeps its rows (see :func:`consolidate_partial`)."""
    if np is None:  # pragma: no cover - numpy ships with every supported install
        summed = group_sums(table, keys, name=DIFF, where=where, use_threads=False).select(table.column_names)
        summed = summed.take(pc.sort_indices(summed, sort_keys=[(k, "ascending", "at_end") for k in keys]))
        return summed.filter(pc.not_equal(summed[DIFF], 0)), True
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    sums, over = run_sums(table.column(DIFF), starts, where=where, partial=partial)
    rows = starts
    if over is not None:  # keep the rows of the runs whose sum leaves int64, with their own diffs
        run_of = np.cumsum(np.concatenate(([True], ~same))) - 1
        rows = np.flatnonzero(np.isin(np.arange(table.num_rows), starts) | over[run_of])
        own = table.column(DIFF).take(pa.array(rows)).to_numpy()
        sums = np.where(over[run_of[rows]], own, sums[run_of[rows]])
    summed = table.take(pa.array(rows)).set_column(
        table.schema.get_field_index(DIFF), table.schema.field(DIFF), pa.array(sums, pa.int64())
    )
    return summed.filter(pc.not_equal(summed[DIFF], 0)), over is None


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
    return _with_nulls(rank[_filled(enc.indices, 0).to_numpy()], bound, arr)


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
        codes = _filled(arr, lo).to_numpy().astype(np.uint64) - np.uint64(lo % _U64)
        return _with_nulls(codes, hi - lo + 1, arr)
    if pa.types.is_floating(t):
        enc = arr.dictionary_encode()
        if len(enc.dictionary) > n // 2:  # mostly distinct: ranking every row directly is cheaper
            codes, bound = _dense(_ordered_float_bits(_filled(arr, 0.0).to_numpy()))
            return _with_nulls(codes, bound, arr)
        return _ranked_dictionary(arr, _float_rank, enc)
    if pa.types.is_boolean(t):
        codes = _filled(arr, False).to_numpy(zero_copy_only=False).astype(np.uint64)
        return _with_nulls(codes, 2, arr)
    if t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        return _ranked_dictionary(arr, _sorted_rank)
    if pa.types.is_dictionary(t) and t.value_type in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        return _ranked_dictionary(arr, _sorted_rank, arr)  # staging's encoded strings (part_io._stage_slice)
    return None


def _filled(arr: pa.Array, value: Any) -> pa.Array:
    """``pc.fill_null(arr, value)``; ``arr`` itself when it has no null (the same values, no kernel call)."""
    return pc.fill_null(arr, value) if arr.null_count else arr


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
    got = _order_by(None, [one_array(table.column(k)) for k in keys])
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


def one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
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
            # staging's encoded strings (part_io._stage_slice): one dictionary of distinct values,
            # so equal indices are equal values (and null indices null values)
            col = one_array(col).indices
        a, b = col.slice(0, n - 1), col.slice(1, n - 1)
        eq = pc.equal(a, b)  # without nulls, the same mask as the null-aware one below
        if col.null_count:
            eq = pc.or_(pc.fill_null(eq, False), pc.and_(pc.is_null(a), pc.is_null(b)))
        if pa.types.is_floating(col.type):
            eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
        same = eq if same is None else pc.and_(same, eq)
        if not pc.any(same).as_py():
            return None
    if same is None:
        return None
    return same.to_numpy(zero_copy_only=False) if np is not None else same
