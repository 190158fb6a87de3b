"""One definition of float equality for rows: ``-0.0`` is ``0.0``, and every NaN is one NaN.

A shard's row identity decides which updates consolidate: an insert and a retraction of
"the same row" must cancel wherever they meet, whether inside one batch (staging's
consolidation), across batches (a snapshot's group-by, compaction, Spark's aggregation)
or in a verifier. IEEE 754 gives floats two notions of equality that disagree exactly
here: ``-0.0 == 0.0`` while their bits differ, and ``NaN != NaN`` while there are 2^52
NaN bit patterns (sign and payload). Arrow's hash group-by compares bits; staging's
sort kernel compared values; Spark normalises both in grouping keys. So a ``+1`` of
``0.0`` and a ``-1`` of ``-0.0`` in different batches, stored as written, would leave a
shard whose snapshot reports a negative multiplicity.

**The rule.** Float values are *canonical* in every part shardsink writes: ``-0.0`` is
stored as ``+0.0`` and every NaN (any sign, any payload, signalling or quiet) as the one
quiet NaN ``0x7ff8000000000000`` (``0x7fc00000`` for float32, ``0x7e00`` for float16).
Every Arrow read path canonicalises again (:func:`canonical_table`), so parts written
before this rule, by another writer, or by hand, consolidate the same way. Two rows are
the same row iff their canonical values are equal bit for bit (nulls equal nulls), which
is what Arrow's group-by, the staging sort and Spark's normalised grouping all agree on.

SUBTLE: a reader that bypasses these paths (a raw ``pq.read_table`` of a part) may see
``-0.0`` or a NaN payload in parts written before this rule; group such rows with the
engine's float normalisation (Spark does it by default) or call :func:`canonical_table`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

#: The canonical quiet NaN of each float width (bit patterns, for tests and documentation).
CANONICAL_NAN_BITS = {16: 0x7E00, 32: 0x7FC00000, 64: 0x7FF8000000000000}


def _is_float(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def canonical_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``arr`` with ``-0.0`` as ``+0.0`` and every NaN as the canonical NaN; nulls kept.

    A no-op (the same object) for non-float arrays. Cost: one add and one select per
    float column (both vectorised); no copy of any other column.
    """
    if not _is_float(arr.type):
        return arr
    if pa.types.is_float16(arr.type):  # Arrow has no float16 arithmetic: exact round trip through float32
        return canonical_array(arr.cast(pa.float32())).cast(pa.float16())
    # -0.0 + 0.0 == +0.0 under round-to-nearest; every other value (NaN included) is unchanged by it.
    plus = pc.add(arr, pa.scalar(0.0, arr.type))
    nan = pc.is_nan(plus)
    if not pc.any(nan).as_py():
        return plus
    return pc.if_else(nan, pa.scalar(float("nan"), arr.type), plus)


def has_floats(schema: pa.Schema) -> bool:
    return any(_is_float(f.type) for f in schema)


def canonical_table(table: pa.Table) -> pa.Table:
    """``table`` with every float column canonical (:func:`canonical_array`); others untouched."""
    for i, f in enumerate(table.schema):
        if _is_float(f.type):
            table = table.set_column(i, f, canonical_array(table.column(i)))
    return table


def canonical_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """:func:`canonical_table` for one record batch."""
    for i, f in enumerate(batch.schema):
        if _is_float(f.type):
            batch = batch.set_column(i, f, canonical_array(batch.column(i)))
    return batch
