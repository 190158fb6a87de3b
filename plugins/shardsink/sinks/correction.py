"""The materialize sink's correction: ``desired - persisted``, as a distributed Spark plan.

For the batch ``[lower, upper)`` of a self-correcting view (DESIGN.md, Materialize sink):

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

HAZARDS: ``desired`` is evaluated lazily inside the staging job; it must be
deterministic (re-executed Spark tasks must produce the same rows) and must itself read
its inputs as of ``upper - 1`` under leases (use the same :class:`ShardReads`). The
persisted read is leased by ``reads``: stage inside its ``with`` block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from shardsink.core import parts as pt
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.spark import types as sty
from shardsink.spark.read import raise_record

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
    got = {f.name: f.dataType for f in desired.schema.fields if f.name != pt.COUNT}
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    wrong = [f"{n}: desired {got[n].simpleString()}, shard {want[n].simpleString()}"
             for n in want if n in got and got[n] != want[n]]
    count = next((f for f in desired.schema.fields if f.name == pt.COUNT), None)
    if count is not None and count.dataType.simpleString() not in ("bigint", "int"):
        wrong.append(f"{pt.COUNT}: desired {count.dataType.simpleString()}, expected bigint")
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
    zero = F.lit(0).cast("long")
    mult = F.col(pt.COUNT).cast("long") if pt.COUNT in desired.columns else F.lit(1).cast("long")
    both = desired.select(*cols, mult.alias(_D), zero.alias(_P))
    if persisted is not None:
        both = both.unionByName(persisted.select(*cols, zero.alias(_D), F.col(pt.DIFF).alias(_P)))
    summed = both.groupBy(*cols).agg(F.sum(_D).alias(_D), F.sum(_P).alias(_P))
    row = F.to_json(F.struct(*cols))
    d, p = F.col(_D), F.col(_P)
    diff = (
        F.when(p < 0, raise_record("CorruptionError", F.concat(
            F.lit(f"output shard {where}: negative multiplicity "), p.cast("string"), F.lit(" for row "), row), row))
        .when(d < 0, raise_record("InvalidUsageError", F.concat(
            F.lit(f"invalid desired DataFrame for {where}: _count sums to "), d.cast("string"), F.lit(" for row "),
            row), row))
        .otherwise(d - p)
    )
    out = summed.select(*cols, F.lit(upper - 1).cast("long").alias(pt.TIME), diff.alias(pt.DIFF))
    return out.filter(F.col(pt.DIFF) != 0)


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
    persisted = None
    if any(b.lower < lower for b in shard.batches()):
        persisted = reads.updates(shard.url, lower - 1)
    return correction_frame(desired, persisted, schema=schema, upper=upper, where=shard.url)
