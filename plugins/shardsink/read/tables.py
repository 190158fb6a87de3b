"""Engine reads materialised as Arrow tables of the core's schema (the CLI's ``--engine``).

:func:`engine_table` runs a leased engine read to completion inside its lease and returns
the same columns and types as :meth:`shardsink.Shard.snapshot` / ``changes`` (the engine
may widen or rename types, e.g. DuckDB's ``HUGEINT`` sums; the table is cast back, safely).
Row order is the engine's; callers sort.
"""

from __future__ import annotations

import pyarrow as pa

from shardsink import read
from shardsink.core.plan import ReadPlan, SchemaChoice
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import CorruptionError, InvalidUsageError


def engine_table(engine: str, url: str, *, as_of: int | None = None, changes: tuple[int, int] | None = None,
                 schema: SchemaChoice = "current") -> pa.Table:
    """The snapshot at ``as_of`` or the change feed ``changes`` of ``url`` read by ``engine``
    (``duckdb`` or ``polars``) with the ``schema`` choice, as an Arrow table; InvalidUsageError
    naming the extra to install when the engine is missing (or a bad ``schema``),
    CorruptionError on a negative multiplicity or a ``_diff`` sum outside int64."""
    if engine == "duckdb":
        table, plan = _duckdb_table(url, as_of, changes, schema)
    elif engine == "polars":
        table, plan = _polars_table(url, as_of, changes, schema)
    else:
        raise InvalidUsageError(f"engine {engine!r} has no engine reader; expected 'duckdb' or 'polars'")
    extra = [pa.field(COUNT, pa.int64())] if changes is None else \
        [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]
    want = pa.schema([*plan.schema, *extra])
    return table.select(want.names).cast(want)


def _duckdb_table(url: str, as_of: int | None, changes: tuple[int, int] | None,
                  schema: SchemaChoice) -> tuple[pa.Table, ReadPlan]:
    read.check_engine("duckdb")
    import duckdb

    con = duckdb.connect()
    try:
        leased = read.duckdb(con, url, as_of, changes=changes, schema=schema)
        with leased as rel:
            try:
                return rel.to_arrow_table(), leased.plan
            except duckdb.InvalidInputException as e:
                if "CorruptionError: " in str(e):  # the check in shardsink.read.duckdb_read
                    raise CorruptionError(str(e).split("CorruptionError: ", 1)[1]) from e
                raise
    finally:
        con.close()


def _polars_table(url: str, as_of: int | None, changes: tuple[int, int] | None,
                  schema: SchemaChoice) -> tuple[pa.Table, ReadPlan]:
    read.check_engine("polars")
    leased = read.polars(url, as_of, changes=changes, schema=schema)
    with leased as lf:
        return lf.collect().to_arrow(), leased.plan
