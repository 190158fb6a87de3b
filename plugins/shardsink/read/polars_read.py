"""Polars LazyFrames of shard snapshots and change feeds (see :mod:`shardsink.read`).

The frame scans exactly the parts of the pinned plan (:mod:`shardsink.core.plan`) with
``pl.scan_parquet`` (local paths, or ``s3://`` URIs that Polars reads natively with the
store's endpoint and credentials, :func:`shardsink.read.store.polars_storage_options`);
no globbing, no hive partitions. The time filter, float normalisation and the ``_diff``
sum run in Polars, lazily.

Names: a user column is selected by its literal name (:func:`col`), never through ``pl.col``,
which reads ``*`` and ``^...$`` as patterns (a shard's column may be named so).

Floats: grouping keys are normalised first (``-0.0`` as ``0.0``, every NaN as the one
NaN), as :mod:`shardsink.core.floats` defines row equality.

Secrets: on S3 the frame's scan carries only the endpoint and region in its storage
options; the credentials come from a provider (:class:`shardsink.read.store.PolarsCredentials`)
that keeps them in memory and never serialises them, so ``LazyFrame.serialize()`` holds none.

A negative multiplicity, or a ``_diff`` sum outside int64, fails ``collect()`` with
CorruptionError naming the shard (raised by a check on the summed column inside the query;
Polars passes it through). ``_diff`` is summed as Int128 (Polars' Int64 sum wraps silently)
and cast back to Int64 after the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import polars.selectors as cs
import pyarrow as pa

from shardsink.core.plan import ReadPlan
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import CorruptionError
from shardsink.read import store


def col(name: str) -> pl.Expr:
    """The column named exactly ``name`` (``pl.col`` would expand ``*`` or a ``^...$`` regex)."""
    return cs.by_name(name).as_expr()


def scan(plan: ReadPlan) -> pl.LazyFrame:
    """The raw updates of ``plan``'s parts: its columns + ``_time`` + ``_diff``, unfiltered.

    Each group of parts written with one schema id (:meth:`ReadPlan.groups`) is scanned and
    projected onto the plan's columns by field id (``col(src).cast(type).alias(name)``, or
    ``pl.lit(None).cast(type)`` for a column the parts predate); the groups are concatenated."""
    options: dict[str, Any] = {}
    frames = []
    target = pl.from_arrow(plan.schema.empty_table())
    assert isinstance(target, pl.DataFrame)
    dtypes = target.schema
    for r, parts in plan.groups():
        where = store.locate(plan.url, parts)
        if where.s3 and not options:
            options = store.polars_scan_options(store.s3_config())  # secrets only in the provider
        lf = pl.scan_parquet(list(where.uris()), glob=False, hive_partitioning=False, **(options if where.s3 else {}))
        cols = [pl.lit(None).cast(dtypes[c.name]).alias(c.name) if c.source is None
                else col(c.source).cast(dtypes[c.name]).alias(c.name) for c in r.projection]
        diff = pl.lit(1, dtype=pl.Int64).alias(DIFF) if r.part.implicit_diffs else pl.col(DIFF)  # no _diff stored
        frames.append(lf.select([*cols, pl.col(TIME), diff]))
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _normalised(name: str, dtype: pl.DataType) -> pl.Expr:
    c = col(name)
    if dtype not in (pl.Float32, pl.Float64):
        return c
    return (pl.when(c.is_nan()).then(pl.lit(float("nan"), dtype)).when(c == 0).then(pl.lit(0.0, dtype))
            .otherwise(c).alias(name))


def frame(plan: ReadPlan) -> pl.LazyFrame:
    """The consolidated snapshot or change feed of ``plan`` as a LazyFrame."""
    if plan.empty:
        return _empty(plan)
    lf = scan(plan)
    t = pl.col(TIME)
    if plan.mode == "snapshot":
        if plan.filter_upper:
            lf = lf.filter(t <= plan.as_of)
    else:
        if plan.filter_lower:
            lf = lf.filter(t >= plan.lower)
        if plan.filter_upper:
            lf = lf.filter(t < plan.upper)
    dtypes = lf.collect_schema()
    cols = [_normalised(c, dtypes[c]) for c in plan.columns]
    keys = [col(c) for c in plan.columns]
    total = pl.col(DIFF).cast(pl.Int128).sum()
    if plan.mode == "changes":
        time = pl.max_horizontal(t, pl.lit(plan.since, pl.Int64)).alias(TIME) if plan.advance else t
        summed = lf.select([*cols, time, pl.col(DIFF)]).group_by([*keys, pl.col(TIME)]).agg(total.alias(DIFF))
        checked = summed.with_columns(pl.col(DIFF).map_batches(_check(plan, DIFF, negative=False),
                                                               return_dtype=pl.Int64))
        return checked.filter(pl.col(DIFF) != 0)
    summed = lf.select([*cols, pl.col(DIFF)]).group_by(keys).agg(total.alias(COUNT))
    checked = summed.with_columns(pl.col(COUNT).map_batches(_check(plan, COUNT, negative=True),
                                                            return_dtype=pl.Int64))
    return checked.filter(pl.col(COUNT) > 0)


_I64 = (-(2**63), 2**63 - 1)


def _check(plan: ReadPlan, name: str, *, negative: bool) -> Callable[[pl.Series], pl.Series]:
    """The check of the Int128 sums ``name``: CorruptionError naming the shard on a sum outside
    int64 and, if ``negative``, on a negative multiplicity; else the sums as Int64."""
    where = plan.describe()

    def check(sums: pl.Series) -> pl.Series:
        if negative and len(bad := sums.filter(sums < 0)):
            raise CorruptionError(f"{where} has {len(bad)} rows with negative multiplicity, e.g. {bad[0]!r}")
        if len(bad := sums.filter((sums < _I64[0]) | (sums > _I64[1]))):
            raise CorruptionError(f"{where} has {len(bad)} rows whose {name} sum overflows int64, e.g. {bad[0]!r}")
        return sums.cast(pl.Int64)

    return check


def _empty(plan: ReadPlan) -> pl.LazyFrame:
    extra = [pa.field(COUNT, pa.int64())] if plan.mode == "snapshot" else \
        [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]
    out = pl.from_arrow(pa.schema([*plan.schema, *extra]).empty_table())
    assert isinstance(out, pl.DataFrame)
    return out.lazy()
