"""DuckDB relations of shard snapshots and change feeds (see :mod:`shardsink.read`).

The relation scans exactly the parts of the pinned plan (:mod:`shardsink.core.plan`):
local parts with DuckDB's own ``read_parquet``, S3 parts (and local paths with glob
characters) as a ``pyarrow.dataset`` over pyarrow's filesystem, which DuckDB scans with
projection and filter pushdown; no DuckDB extension is needed or downloaded. The time
filter, float normalisation and ``sum(_diff)`` ``GROUP BY`` run in DuckDB, lazily: nothing
is read until the relation is executed.

Floats: grouping keys are normalised first (``-0.0`` as ``0.0``, every NaN as the one
NaN), as :mod:`shardsink.core.floats` defines row equality. SUBTLE: DuckDB folds
``isnan(x)`` to false when a Parquet file's statistics of ``x`` exclude NaN (pyarrow writes
them so), so the NaN test reads ``[x][1]``, which carries no statistics.

A negative multiplicity, or a ``_diff`` sum outside int64 (DuckDB sums BIGINT as HUGEINT;
the result's ``_count``/``_diff`` are BIGINT, and a sum that does not fit is refused rather
than wrapped or left to a bare cast error), fails the query with DuckDB's
``InvalidInputException`` whose message starts with ``CorruptionError:`` and names the shard
(DuckDB's ``error()``): the check runs inside the engine, when the relation executes.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads

from shardsink.core.plan import PartRead, ReadPlan
from shardsink.core.state import PartMeta
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import InvalidUsageError
from shardsink.read import store


def quote(name: str) -> str:
    """``name`` as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def _normalised(col: str, duck_type: str) -> str:
    """The expression of column ``col`` with floats canonical (module docstring)."""
    q = quote(col)
    if duck_type in ("DOUBLE", "FLOAT"):
        return (f"CASE WHEN isnan([{q}][1]) THEN CAST('NaN' AS {duck_type}) "
                f"ELSE {q} + CAST(0 AS {duck_type}) END AS {q}")
    return q


def scan(con: duckdb.DuckDBPyConnection, plan: ReadPlan) -> duckdb.DuckDBPyRelation:
    """The raw updates of ``plan``'s parts: its columns + ``_time`` + ``_diff``, unfiltered.

    Each group of parts written with one schema id (:meth:`ReadPlan.groups`) is scanned with
    its own Parquet columns and projected onto the plan's by field id (a renamed column
    ``src AS name``, a widened one ``CAST(src AS type)``, a column the parts predate
    ``CAST(NULL AS type)``); the groups are unioned (``UNION ALL``, same column order).
    """
    duck = dict(zip(plan.columns, (str(t) for t in con.from_arrow(plan.schema.empty_table()).types), strict=True))
    rels = [_scan_group(con, plan, r, parts, duck) for r, parts in plan.groups()]
    rel = rels[0]
    for other in rels[1:]:
        rel = rel.union(other)
    return rel


def _scan_group(con: duckdb.DuckDBPyConnection, plan: ReadPlan, r: PartRead, parts: tuple[PartMeta, ...],
                duck: dict[str, str]) -> duckdb.DuckDBPyRelation:
    where = store.locate(plan.url, parts)
    source = r.written
    ones = r.part.implicit_diffs  # the group's files store no _diff: every diff is 1
    if not where.s3 and not where.globby:
        rel = con.read_parquet(list(where.paths), hive_partitioning=False, union_by_name=False)
    else:
        fs = store.arrow_filesystem(store.s3_config()) if where.s3 else None
        full = pa.schema([*source, pa.field(TIME, pa.int64(), False),
                          *([] if ones else [pa.field(DIFF, pa.int64(), False)])])
        dataset = pads.dataset(list(where.paths), schema=full, format="parquet", filesystem=fs)
        rel = con.from_arrow(dataset)
    cols = []
    for c in r.projection:
        if c.source is None:
            cols.append(f"CAST(NULL AS {duck[c.name]}) AS {quote(c.name)}")
        elif c.source == c.name and source.field(c.source).type == c.type:
            cols.append(quote(c.name))
        else:
            cols.append(f"CAST({quote(c.source)} AS {duck[c.name]}) AS {quote(c.name)}")
    diff = f"CAST(1 AS BIGINT) AS {quote(DIFF)}" if ones else quote(DIFF)
    return rel.project(", ".join([*cols, quote(TIME), diff]))


def relation(con: duckdb.DuckDBPyConnection, plan: ReadPlan) -> duckdb.DuckDBPyRelation:
    """The consolidated snapshot or change feed of ``plan`` as a lazy relation."""
    if plan.empty:
        return _empty(con, plan)
    rel = scan(con, plan)
    t = quote(TIME)
    if plan.mode == "snapshot":
        if plan.filter_upper:
            rel = rel.filter(f"{t} <= {plan.as_of}")
    else:
        if plan.filter_lower:
            rel = rel.filter(f"{t} >= {plan.lower}")
        if plan.filter_upper:
            rel = rel.filter(f"{t} < {plan.upper}")
    types = dict(zip(rel.columns, (str(x) for x in rel.types), strict=True))
    keys = [quote(c) for c in plan.columns]
    cols = [_normalised(c, types[c]) for c in plan.columns]
    d = quote(DIFF)
    if plan.mode == "changes":
        time = f"greatest({t}, CAST({plan.since} AS BIGINT)) AS {t}" if plan.advance else t
        rel = rel.project(", ".join([*cols, time, d]))
        summed = rel.aggregate(", ".join([*keys, t, f"sum({d}) AS {d}"]), ", ".join([*keys, t]))
        return summed.project(", ".join([*keys, t, _checked(plan, DIFF, negative=False)])).filter(f"{d} <> 0")
    c = quote(COUNT)
    rel = rel.project(", ".join([*cols, d]))
    summed = rel.aggregate(", ".join([*keys, f"sum({d}) AS {c}"]), ", ".join(keys))
    return summed.project(", ".join([*keys, _checked(plan, COUNT, negative=True)])).filter(f"{c} > 0")


def _checked(plan: ReadPlan, name: str, *, negative: bool) -> str:
    """The HUGEINT sum column ``name`` as BIGINT, failing the query (``CorruptionError: ...``)
    on a sum outside int64 and, if ``negative``, on a negative multiplicity."""
    col = quote(name)
    over = literal(f"CorruptionError: {plan.describe()} has a row whose {name} sum overflows int64: ")
    cases = [f"WHEN {col} < {-2**63} OR {col} > {2**63 - 1} THEN error({over} || CAST({col} AS VARCHAR))"]
    if negative:
        message = literal(f"CorruptionError: {plan.describe()} has a row with negative multiplicity ")
        cases.insert(0, f"WHEN {col} < 0 THEN error({message} || CAST({col} AS VARCHAR))")
    return f"CASE {' '.join(cases)} ELSE CAST({col} AS BIGINT) END AS {col}"


def _empty(con: duckdb.DuckDBPyConnection, plan: ReadPlan) -> duckdb.DuckDBPyRelation:
    extra = [pa.field(COUNT, pa.int64())] if plan.mode == "snapshot" else \
        [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]
    table = pa.schema([*plan.schema, *extra]).empty_table()
    return con.from_arrow(table)


def check_connection(con: Any) -> None:
    """InvalidUsageError unless ``con`` is a DuckDB connection."""
    if not isinstance(con, duckdb.DuckDBPyConnection):
        raise InvalidUsageError(f"con must be a duckdb.DuckDBPyConnection, got {type(con).__name__}")
