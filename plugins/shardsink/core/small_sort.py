"""The order consolidation sorts a small table in, found with Python's list sort.

:mod:`shardsink.core.consolidate` orders rows by mapping each key column to integer codes and
sorting them with numpy: a fixed cost of several Arrow kernels per key (a dictionary encode,
a min/max, a sort of the dictionary, a gather) that dominates for a table of a few dozen rows,
the size of most appends. :func:`small_order` gives, for such a table, exactly the same order
(``pc.sort_indices(..., null_placement="at_end")``, stable) and the mask of adjacent equal rows
that :func:`shardsink.core.consolidate._adjacent_same` computes, from the key values as Python
objects, for the key types whose Python order and equality are Arrow's: integers, booleans,
temporal types (compared as their integer storage, as the coding does), strings and binaries
(UTF-8 keeps code point order bytewise), and strings or binaries dictionary-encoded with a
dictionary of distinct non-null values (staging's encoding). Floats (``-0.0 == 0.0``, NaN) and
other types take the vectorised path.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

#: Tables of at most this many rows are ordered here (measured: the vectorised coding costs about
#: 0.2 ms for a 20-row table of three keys, this path a tenth of it).
SMALL_ROWS = 128
_BYTES_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def small_order(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Array, np.ndarray | None] | None:
    """``(order, same)`` for a table of 2 to :data:`SMALL_ROWS` rows: ``order`` the indices
    (int64) sorting it ascending by ``keys``, nulls last, stably; ``same[i]`` whether sorted
    rows ``i`` and ``i + 1`` agree on every key (nulls equal nulls), None if no two do.
    None (nothing done) for another size or a key type this module does not order."""
    n = table.num_rows
    if not 2 <= n <= SMALL_ROWS:
        return None
    cols = []
    for k in keys:
        values = _values(table.column(k))
        if values is None:
            return None
        cols.append(values)
    rows = list(zip(*cols, strict=True))
    order = sorted(range(n), key=rows.__getitem__)
    ordered = [rows[i] for i in order]
    same = [a == b for a, b in pairwise(ordered)]
    return pa.array(order, pa.int64()), (np.array(same, bool) if any(same) else None)


def _values(col: pa.ChunkedArray) -> list[Any] | None:
    """The column's values, ordered and compared as Arrow sorts them (a null as ``(1, 0)``
    after every ``(0, value)``); None for a type not ordered here."""
    t = col.type
    if pa.types.is_dictionary(t):
        if t.value_type not in _BYTES_TYPES or col.num_chunks != 1:
            return None
        dictionary = col.chunk(0).dictionary
        if dictionary.null_count or len(set(dictionary.to_pylist())) != len(dictionary):
            return None  # equal values under two indices: the coding orders them apart
    elif pa.types.is_temporal(t) and not pa.types.is_interval(t):
        storage = pa.int32() if t.bit_width == 32 else pa.int64()
        col = pa.chunked_array([c.view(storage) for c in col.chunks], storage)
    elif not (pa.types.is_integer(t) or pa.types.is_boolean(t) or t in _BYTES_TYPES):
        return None
    values = col.to_pylist()
    if col.null_count == 0:
        return values
    return [(1, 0) if v is None else (0, v) for v in values]

