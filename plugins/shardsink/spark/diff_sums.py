"""Exact sums of ``_diff`` in Spark: the ONE definition of summing updates in the Spark paths.

Spark sums ``bigint`` in 64 bits: in ANSI mode (Spark 4's default) a running total that
leaves int64 fails the job with ``ARITHMETIC_OVERFLOW`` even when the final sum is in range,
and with ANSI off it wraps silently. Here every ``_diff`` sum is exact, as in the pyarrow,
DuckDB and Polars reads (:mod:`shardsink.core.diff_sums`): an overflow on the way that ends in
range gives the exact sum, and a final sum outside int64 fails the job with a CorruptionError
record naming the row (:func:`checked_sum`; leaving :class:`~shardsink.spark.read.ShardReads`
raises it).

Cost: an exact sum is a ``decimal(38,0)`` aggregate, about 1.15x the time of a plain
``bigint`` ``groupBy`` (2M distinct rows, local[2]). Callers that know a bound on the inputs
(:func:`may_overflow`: ``max |diff| x rows`` from the parts' ``_diff`` statistics) keep the
plain ``bigint`` sum, which can then never leave int64 in any order.

Also the append-side check of Spark staging (:func:`check_staged_sums`): an appended DataFrame
whose equal rows (user columns and ``_time``) sum outside int64 is refused with
InvalidUsageError, as :meth:`Shard.stage` refuses such a table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core.updates import DIFF, TIME
from shardsink.errors import InvalidUsageError
from shardsink.outcome import MARK, ErrorClass

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from shardsink.core.state import PartMeta

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EXACT = "decimal(38,0)"  # holds any sum of < 10**19 int64 values exactly


def col(name: str) -> Column:
    """The column ``name`` exactly (quoted: a dot, space or backtick in a name is not syntax)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def cols(names: Iterable[str]) -> list[Column]:
    return [col(n) for n in names]


def may_overflow(max_abs: int | None, rows: int) -> bool:
    """Whether some sum of ``rows`` diffs of magnitude at most ``max_abs`` (None: unknown) can leave int64."""
    return rows >= 2 and (max_abs is None or max_abs * rows > I64_MAX)


def parts_may_overflow(root: str, parts: Sequence[PartMeta]) -> bool:
    """:func:`may_overflow` over ``parts`` read natively under ``root``: True unless ``root`` is a
    local folder whose part footers all carry ``_diff`` statistics (reading a local footer is
    cheap; an ``s3a`` root would cost a request per part, so its sums are always exact). A
    footer that cannot be read also answers True: the scan itself then reports the part. A
    part with implicit diffs (:attr:`PartMeta.implicit_diffs`) bounds its diffs at 1 unread."""
    rows = sum(p.rows for p in parts)
    if rows < 2:
        return False
    if not root.startswith("file://"):
        return True
    top = 1 if any(p.implicit_diffs for p in parts) else 0
    for p in parts:
        if p.implicit_diffs:  # every diff is 1 (no _diff stored): no footer to read
            continue
        try:
            got = stats_range(pq.read_metadata(Path(root[len("file://"):]) / p.key), DIFF)
        except (OSError, pa.ArrowException):
            return True
        if got is None:
            return True
        top = max(top, -got[0], got[1])
        if may_overflow(top, rows):
            return True
    return False


def stats_range(meta: pq.FileMetaData, name: str) -> tuple[int, int] | None:
    """Min and max of the integer column ``name`` of a Parquet file from its row groups'
    statistics (None if the file lacks the column or any row group lacks them)."""
    if name not in meta.schema.names:
        return None
    index = meta.schema.names.index(name)
    lo: int | None = None
    hi: int | None = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(index).statistics
        if st is None or not st.has_min_max:
            return None
        lo = int(st.min) if lo is None else min(lo, int(st.min))
        hi = int(st.max) if hi is None else max(hi, int(st.max))
    return None if lo is None or hi is None else (lo, hi)


def summed(df: DataFrame, keys: Sequence[str], name: str, *, exact: bool = True,
           source: str = DIFF) -> DataFrame:
    """``df`` grouped by ``keys`` with ``source`` summed into ``name`` (``decimal(38,0)`` when
    ``exact``, else ``bigint``: only where :func:`may_overflow` is False); pass the result's
    ``name`` through :func:`checked_sum`."""
    from pyspark.sql import functions as F

    value = col(source).cast(EXACT) if exact else col(source)
    return df.groupBy(*cols(keys)).agg(F.sum(value).alias(name))


def checked_sum(name: str, keys: Sequence[str], where: str, *, negative: bool = False,
                error_class: ErrorClass = "CorruptionError", label: str | None = None) -> Column:
    """The sum column ``name`` as ``bigint``; the job fails with an ``error_class`` record naming
    ``where``, the sum (as ``label``, default ``name``) and the row (the ``keys`` as JSON) if it
    is outside int64 or, with ``negative``, below zero (a negative multiplicity)."""
    from pyspark.sql import functions as F

    c = col(name)
    row = F.to_json(F.struct(*cols(keys)))

    def fail(what: str) -> Column:
        return raise_record(error_class, F.concat(F.lit(f"{where}{what}"), c.cast("string"), F.lit(" for row "),
                                                  row), row)

    outside = (c < F.lit(I64_MIN)) | (c > F.lit(I64_MAX))
    out = F.when(outside, fail(f" has a row whose {label or name} sum overflows int64: "))
    if negative:
        out = out.when(c < 0, fail(": negative multiplicity "))
    return out.otherwise(c).cast("long")


def raise_record(error_class: ErrorClass, message: Column, value: Column) -> Column:
    """A SQL ``raise_error`` whose text is a typed error record (:mod:`shardsink.outcome`).

    The record is built by ``to_json`` (proper escaping of any row value), so the driver
    decodes it exactly instead of matching the message.
    """
    from pyspark.sql import functions as F

    record = F.to_json(F.struct(F.lit(error_class).alias("error_class"), F.lit(error_class).alias("raised"),
                                message.alias("message"), value.alias("value")))
    return F.raise_error(F.concat(F.lit(MARK), record))


def check_staged_sums(df: DataFrame, names: Sequence[str], *, max_abs: int | None, rows: int,
                      what: str = "the appended DataFrame") -> None:
    """InvalidUsageError naming ``what`` and a row if rows of ``df`` with equal user columns
    (``names``) and ``_time`` sum outside int64: they consolidate to no int64 diff.

    ``max_abs``/``rows``: a bound of the staged diffs (None: unknown); within it nothing can
    overflow and nothing runs. Past it, ONE exact aggregation of ``df`` (a second evaluation:
    ``df`` must be deterministic, as staging already requires).
    """
    from pyspark.sql import functions as F

    if DIFF not in df.columns or not may_overflow(max_abs, rows):
        return
    keys = [*names, TIME]
    s = col(DIFF)
    bad = summed(df, keys, DIFF).filter((s < F.lit(I64_MIN)) | (s > F.lit(I64_MAX)))
    got = bad.select(s.cast("string").alias("s"), F.to_json(F.struct(*cols(keys))).alias("row")).limit(1).collect()
    if got:
        raise InvalidUsageError(f"{what} has rows whose {DIFF} sum overflows int64, e.g. {got[0]['s']} for row "
                                f"{got[0]['row']}; equal rows (user columns and {TIME}) must sum inside int64",
                                value=str(got[0]["s"]))
