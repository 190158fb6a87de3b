"""Exact sums of ``_diff``: the ONE definition of summing updates in the pyarrow paths.

Arrow's hash ``sum`` and numpy's ``add.reduceat`` add int64 with wrap-around: four updates of
``2**62`` sum to ``0`` and a row silently vanishes. Every ``_diff`` sum here is exact: a sum
whose running total leaves int64 but ends inside it is returned exactly (the wrapped int64 sum
is the true sum modulo ``2**64``, so equal to it whenever the true sum fits), and a final sum
outside int64 raises :class:`~shardsink.errors.CorruptionError` naming ``where`` (as the DuckDB
and Polars readers do). Nothing is returned wrapped.

Cost: one ``min_max`` over the diffs (the bound ``max |diff| × rows``; far below ``2**63`` for
real data, whose diffs are small); only past that bound are the diffs split into high and low
32-bit halves, summed alongside (each half's sum fits int64 for < 2**31 rows) and the few sums
whose float estimate nears the int64 limits recomputed exactly in Python ints.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.updates import DIFF
from shardsink.errors import CorruptionError, InvalidUsageError, ShardsinkError

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_HI, _LO = "__shardsink_diff_hi", "__shardsink_diff_lo"
_LOW_MASK = (1 << 32) - 1
#: Tables of at least this many rows are grouped on Arrow's CPU pool; a smaller one in the calling
#: thread, where handing it to the pool costs more than the grouping (a few hundred microseconds).
THREADED_ROWS = 1 << 16


def may_overflow(diffs: pa.Array | pa.ChunkedArray) -> bool:
    """Whether some sum of ``diffs`` (any subset) could pass int64 on the way: ``max |diff| × rows``."""
    n = len(diffs)
    if n < 2:
        return False
    mm = pc.min_max(diffs)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return lo is not None and max(-lo, hi) * n > _I64_MAX  # Python ints: exact


def _halves(diffs: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``(d >> 32, d & 0xffffffff)`` per diff: ``d == hi * 2**32 + lo`` with ``|hi| <= 2**31``, ``0 <= lo < 2**32``."""
    if len(diffs) >= 1 << 31:
        raise CorruptionError(f"cannot sum {len(diffs)} updates exactly (at most 2**31 - 1 at once)")
    d = diffs.to_numpy() if isinstance(diffs, pa.ChunkedArray) else diffs.to_numpy(zero_copy_only=False)
    return d >> np.int64(32), d & np.int64(_LOW_MASK)


def check_halves(hi: np.ndarray, lo: np.ndarray, *, where: str, name: str, partial: bool = False,
                 error: type[ShardsinkError] = CorruptionError) -> np.ndarray | None:
    """``error`` naming ``where`` if some exact sum ``hi * 2**32 + lo`` leaves int64; with
    ``partial``, instead the mask of those sums (None if there is none)."""
    est = hi.astype(np.float64) * float(1 << 32) + lo.astype(np.float64)
    near = np.flatnonzero(np.abs(est) >= float(1 << 62))  # relative error ~2**-52: well inside otherwise
    exact = [(i, int(hi[i]) * (1 << 32) + int(lo[i])) for i in near]
    bad = [(i, s) for i, s in exact if not _I64_MIN <= s <= _I64_MAX]
    if not bad:
        return None
    if not partial:
        raise error(f"{where} has {len(bad)} rows whose {name} sum overflows int64, e.g. {bad[0][1]}")
    mask = np.zeros(len(hi), bool)
    mask[[i for i, _ in bad]] = True
    return mask


def group_sums(table: pa.Table, keys: Sequence[str], *, name: str, where: str,
               use_threads: bool = True, error: type[ShardsinkError] = CorruptionError) -> pa.Table:
    """``table`` grouped by ``keys`` with ``_diff`` summed exactly into column ``name``
    (columns: ``keys`` then ``name``, groups in hash order); ``error`` naming ``where``
    if a sum leaves int64."""
    keys = list(keys)
    if not may_overflow(table[DIFF]):
        summed = table.group_by(keys, use_threads=use_threads).aggregate([(DIFF, "sum")])
        return summed.rename_columns([*keys, name])
    hi, lo = _halves(table[DIFF])
    wide = table.select([*keys, DIFF]).append_column(_HI, pa.array(hi)).append_column(_LO, pa.array(lo))
    summed = wide.group_by(keys, use_threads=use_threads).aggregate([(DIFF, "sum"), (_HI, "sum"), (_LO, "sum")])
    check_halves(summed[f"{_HI}_sum"].to_numpy(), summed[f"{_LO}_sum"].to_numpy(), where=where, name=name,
                 error=error)
    return summed.select([*keys, f"{DIFF}_sum"]).rename_columns([*keys, name])


def run_sums(diffs: pa.Array | pa.ChunkedArray, starts: np.ndarray, *, where: str,
             partial: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The exact ``_diff`` sums of the runs beginning at ``starts`` (int64, as ``np.add.reduceat``)
    and None; CorruptionError naming ``where`` if one leaves int64. With ``partial`` (a chunk of
    the updates: more rows of a run may follow elsewhere), no error: the mask of the runs whose
    sum leaves int64 is returned instead (their int64 sums are wrapped: do not use them)."""
    d = diffs.to_numpy() if isinstance(diffs, pa.ChunkedArray) else diffs.to_numpy(zero_copy_only=False)
    sums = np.add.reduceat(d, starts)
    if not may_overflow(diffs):
        return sums, None
    hi, lo = _halves(diffs)
    over = check_halves(np.add.reduceat(hi, starts), np.add.reduceat(lo, starts), where=where, name=DIFF,
                        partial=partial)
    return sums, over


def check_input_sums(table: pa.Table, keys: Sequence[str], *, what: str) -> None:
    """InvalidUsageError naming ``what`` if rows of an input with equal ``keys`` (row and time)
    sum outside int64: they consolidate to no int64 diff. Checked before anything is written;
    one ``min_max`` unless the diffs are huge."""
    if may_overflow(table[DIFF]):
        group_sums(table, keys, name=DIFF, where=what, use_threads=False, error=InvalidUsageError)
