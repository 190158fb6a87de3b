"""The materialize sink's correction: ``desired - persisted``, as a distributed Spark plan.

For the batch ``[lower, upper)`` of a self-correcting view (docs/architecture.md, "The materialize sink"):

* ``desired``: the view's full contents as of ``upper - 1`` (a DataFrame with exactly
  the output shard's user columns; each row counts once, or ``_count`` times if it has
  a ``_count`` column, e.g. straight from :meth:`ShardReads.snapshot`);
* ``persisted``: the output shard as of ``lower - 1``; empty when no batch covers a time
  before ``lower`` (nothing persisted yet: the first run after creation);
* ``correction = desired - persisted``, every update stamped ``_time = upper - 1``.

Once the correction commits as ``[lower, upper)``, the shard as of ``upper - 1`` equals
``desired``, whatever it held before: an unchanged view yields an empty correction
(an empty batch that only advances the upper), and rows a racing run or a human wrote
by mistake are retracted by the next run.

Plan: ``desired`` (+multiplicity) ∪ persisted updates (their ``_diff``, read without
consolidation, see :mod:`shardsink.spark.datasource`) → one ``groupBy`` over all user
columns summing both sides apart → ``d - p`` where non-zero. One shuffle; the map-side
partial aggregation does the per-partition consolidation. The job fails with a
CorruptionError record if a persisted row sums negative and an InvalidUsageError
record if a desired ``_count`` sums negative (:func:`shardsink.spark.read.raise_record`;
leaving the :class:`ShardReads` block raises the error the record names).

``desired`` itself usually costs a shuffle too (a snapshot read consolidates its
input). For a row-wise view of one input, :func:`linear_correction` skips it: the view
is applied to the input's raw positive and negative updates and both feed the one
``groupBy`` (see :mod:`shardsink.spark.view`, which decides when that is exact).

HAZARDS: ``desired`` is evaluated lazily inside the staging job; it must be
deterministic (re-executed Spark tasks must produce the same rows) and must itself read
its inputs as of ``upper - 1`` under leases (use the same :class:`ShardReads`). The
persisted read is leased by ``reads``: stage inside its ``with`` block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from shardsink.core.shard import Shard
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import InvalidUsageError
from shardsink.spark import diff_sums as sums
from shardsink.spark import types as sty
from shardsink.spark.diff_sums import raise_record

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from shardsink.outcome import ErrorClass
    from shardsink.spark.read import ShardReads

_D, _P = "__desired", "__persisted"


def check_desired_schema(desired: DataFrame, schema: pa.Schema, *, where: str) -> list[str]:
    """The user column names in shard order; InvalidUsageError naming every mismatch.

    The schema is fixed when the shard is created: same column names (any order) and the
    same Spark types are required; nullability is not compared. An optional ``_count``
    (bigint) column carries multiplicities.
    """
    expected = sty.spark_schema(schema, time=False, diff=None)
    want = {f.name: f.dataType for f in expected.fields}
    got = {f.name: f.dataType for f in desired.schema.fields if f.name != COUNT}
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    wrong = [f"{n}: desired {got[n].simpleString()}, shard {want[n].simpleString()}"
             for n in want if n in got and got[n] != want[n]]
    count = next((f for f in desired.schema.fields if f.name == COUNT), None)
    if count is not None and count.dataType.simpleString() not in ("bigint", "int"):
        wrong.append(f"{COUNT}: desired {count.dataType.simpleString()}, expected bigint")
    if missing or extra or wrong:
        raise InvalidUsageError(
            f"the desired DataFrame does not match the schema of output shard {where} (fixed at creation): "
            f"missing columns {missing}, unexpected columns {extra}, type mismatches {wrong}; "
            f"expected ({sty.describe(expected)})"
        )
    return list(want)


def correction_frame(desired: DataFrame, persisted: DataFrame | None, *, schema: pa.Schema, upper: int,
                     where: str) -> DataFrame:
    """``desired - persisted`` stamped at ``upper - 1`` (user columns + ``_time`` + ``_diff``).

    ``persisted`` is the output's raw snapshot updates (user columns + ``_diff``) or None.
    """
    from pyspark.sql import functions as F

    cols = check_desired_schema(desired, schema, where=where)
    counted = COUNT in desired.columns
    mult = sums.col(COUNT).cast(sums.EXACT) if counted else F.lit(1).cast("long")
    negative: tuple[ErrorClass, str] = ("InvalidUsageError", f"invalid desired DataFrame for {where}: _count sums to ")
    return _summed(desired.select(*sums.cols(cols), mult.alias(_D)), persisted, cols, upper=upper, where=where,
                   negative_desired=negative, exact_desired=counted)


def linear_correction(positive: DataFrame, negative: DataFrame, persisted: DataFrame | None, *,
                      schema: pa.Schema, upper: int, where: str, inputs_where: str) -> DataFrame:
    """:func:`correction_frame` for a row-wise view ``V`` of one input, in ONE aggregation.

    ``positive`` = ``V`` over the input's raw updates with ``_diff > 0`` (each repeated
    ``_diff`` times), ``negative`` = ``V`` over those with ``_diff < 0`` (each repeated
    ``-_diff`` times). ``V`` is linear (it maps each row on its own: projections and
    filters), so ``desired = positive - negative`` as multisets, and
    ``positive (+1) ∪ negative (-1) ∪ persisted (-_diff)`` summed per row is the
    correction: the input's own consolidation (a second shuffle) is never needed.

    HAZARD: a negative input multiplicity is detected only where it survives ``V``
    (a CorruptionError naming ``inputs_where``); a corrupt input row the view filters
    out, or one cancelled by another input row ``V`` maps to the same output row, goes
    unnoticed here (a snapshot read of the input still detects it).
    """
    cols = check_desired_schema(positive, schema, where=where)
    signed = _signed(positive, negative, cols)
    corrupt: tuple[ErrorClass, str] = ("CorruptionError", f"{inputs_where}: negative multiplicity ")
    return _summed(signed, persisted, cols, upper=upper, where=where, negative_desired=corrupt)


def incremental_correction(positive: DataFrame, negative: DataFrame, *, schema: pa.Schema, upper: int,
                           where: str) -> DataFrame:
    """The correction of a row-wise view from its input's changes alone (one aggregation).

    ``positive``/``negative`` = ``V`` over the input's updates in ``[lower, upper)`` with
    ``_diff > 0`` / ``< 0`` (each repeated ``|_diff|`` times). Exact only when the output
    as of ``lower - 1`` equals ``V`` of the input as of ``lower - 1``
    (:mod:`shardsink.spark.incremental` decides that). A negative sum is a retraction
    here, not an error.
    """
    cols = check_desired_schema(positive, schema, where=where)
    return _summed(_signed(positive, negative, cols), None, cols, upper=upper, where=where, negative_desired=None)


def _signed(positive: DataFrame, negative: DataFrame, cols: list[str]) -> DataFrame:
    """``positive`` with multiplicity ``_D`` = +1 and ``negative`` with -1, one frame."""
    from pyspark.sql import functions as F

    return positive.select(*sums.cols(cols), F.lit(1).cast("long").alias(_D)).unionByName(
        negative.select(*sums.cols(cols), F.lit(-1).cast("long").alias(_D)))


def _summed(desired: DataFrame, persisted: DataFrame | None, cols: list[str], *, upper: int, where: str,
            negative_desired: tuple[ErrorClass, str] | None, exact_desired: bool = False) -> DataFrame:
    """``desired`` (user columns + signed multiplicity ``_D``) minus ``persisted``: one groupBy.

    ``negative_desired``: the error record for a negative ``_D`` sum, or None if one is a
    legitimate retraction (an incremental correction). Sums are exact
    (:mod:`shardsink.spark.diff_sums`): the persisted diffs always, ``_D`` when
    ``exact_desired`` (a ``_count`` column; else each ``_D`` is ±1 and a ``bigint`` sum of
    fewer than 2**63 of them cannot overflow); a sum outside int64 fails the job (a
    CorruptionError record for the persisted side, ``negative_desired``'s class for ``_D``)."""
    from pyspark.sql import functions as F

    zero = F.lit(0).cast("long")
    qcols = sums.cols(cols)
    both = desired.select(*qcols, _D, (F.lit(0).cast(sums.EXACT) if persisted is not None else zero).alias(_P))
    if persisted is not None:
        zero_d = F.lit(0).cast(sums.EXACT) if exact_desired else zero
        both = both.unionByName(persisted.select(*qcols, zero_d.alias(_D), sums.col(DIFF).cast(sums.EXACT).alias(_P)))
    summed = both.groupBy(*qcols).agg(F.sum(_D).alias(_D), F.sum(_P).alias(_P))
    desired_class = negative_desired[0] if negative_desired is not None else "InvalidUsageError"
    summed = summed.select(*qcols, sums.checked_sum(_D, cols, f"desired rows of {where}", label=COUNT,
                                                    error_class=desired_class).alias(_D),
                           sums.checked_sum(_P, cols, f"output shard {where}", label=DIFF).alias(_P))
    row = F.to_json(F.struct(*qcols))
    d, p = F.col(_D), F.col(_P)
    checked = F.when(p < 0, raise_record("CorruptionError", F.concat(
        F.lit(f"output shard {where}: negative multiplicity "), p.cast("string"), F.lit(" for row "), row), row))
    if negative_desired is not None:
        error_class, message = negative_desired
        checked = checked.when(d < 0, raise_record(error_class, F.concat(
            F.lit(message), d.cast("string"), F.lit(" for row "), row), row))
    diff = checked.otherwise(d - p)
    out = summed.select(*qcols, F.lit(upper - 1).cast("long").alias(TIME), diff.alias(DIFF))
    return out.filter(F.col(DIFF) != 0)


def persisted_updates(reads: ShardReads, output_url: str, *, lower: int) -> DataFrame | None:
    """The output's raw updates as of ``lower - 1`` (leased), or None if no batch covers a time before ``lower``."""
    shard = Shard.open(output_url)
    if any(b.lower < lower for b in shard.batches()):
        return reads.updates(shard.url, lower - 1)
    return None


def compute_correction(reads: ShardReads, desired: DataFrame, output_url: str, *, lower: int,
                       upper: int) -> DataFrame:
    """The correction for batch ``[lower, upper)`` of the view stored at ``output_url``.

    Reads the output as of ``lower - 1`` through ``reads`` (leased: run the staging job
    inside its ``with`` block). Raises InvalidUsageError (bounds, schema) or
    ReadFrontierError (``lower - 1`` not readable) on the driver, before any job.
    """
    if not isinstance(lower, int) or not isinstance(upper, int) or upper <= lower:
        raise InvalidUsageError(f"batch bounds [{lower}, {upper}) are empty or reversed; expected lower < upper")
    shard = Shard.open(output_url)
    schema = shard.schema
    check_desired_schema(desired, schema, where=shard.url)
    persisted = persisted_updates(reads, shard.url, lower=lower)
    return correction_frame(desired, persisted, schema=schema, upper=upper, where=shard.url)
