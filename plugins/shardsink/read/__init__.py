"""Readers beyond Spark: shard snapshots and change feeds as DuckDB relations and Polars frames.

::

    import duckdb, shardsink.read

    con = duckdb.connect()
    with shardsink.read.duckdb(con, "s3://bucket/events", as_of=T) as rel:   # user columns + _count
        rel.aggregate("sum(_count)").fetchall()
    with shardsink.read.polars(url, changes=(lower, upper)) as lf:         # + _time, _diff
        lf.collect()

Both equal :meth:`shardsink.Shard.snapshot` / :meth:`~shardsink.Shard.changes` (with the same
``schema`` choice: ``"current"``, the default, or ``"as_of"``, the schema current at the read's
time) as sets of rows (row order is unspecified): they read exactly the parts of one state version,
pinned under a read lease (:mod:`shardsink.read.plan`), as :mod:`shardsink.core.plan` (the one
planner of parts, columns and time bounds of every reader) plans them, and push the time
filter, float normalisation and the ``_diff`` sum into the engine. Local folders and S3 (the same AWS environment or
:func:`~shardsink.storage.s3.using_s3_access` as the store; nothing is downloaded at
run time) both work.

**Overflow.** ``_diff`` is summed in 128 bits; a sum outside int64 (``_count``/``_diff`` are
int64) fails the read with CorruptionError (DuckDB: its error ``CorruptionError: ...``, see
:mod:`shardsink.read.duckdb_read`) naming the shard, never wraps.

**Lease.** Each call returns a :class:`~shardsink.read.leased.LeasedRead`: a context manager
yielding the engine's relation/LazyFrame. The lease is held for the ``with`` block; without
one, until :meth:`~shardsink.read.leased.LeasedRead.close` or until the returned relation or
frame is garbage-collected. Derived relations/frames do not hold it (see
:mod:`shardsink.read.leased`): run them inside the block.

The engines are optional (``pip install shardsink[duckdb]`` / ``shardsink[polars]``);
importing this package never imports them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from shardsink.core.leases import DEFAULT_TTL_S
from shardsink.core.plan import ReadPlan, SchemaChoice
from shardsink.errors import InvalidUsageError
from shardsink.read.leased import LeasedRead
from shardsink.read.plan import open_plan

if TYPE_CHECKING:
    import duckdb as _duckdb
    import polars as _polars

__all__ = ["LeasedRead", "ReadPlan", "check_engine", "duckdb", "engine_available", "polars"]


def check_engine(name: str) -> ModuleType:
    """The engine module ``name``; InvalidUsageError naming the extra to install if it is missing."""
    if name not in ("duckdb", "polars"):
        raise InvalidUsageError(f"engine {name!r} has no reader; expected 'duckdb' or 'polars'")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise InvalidUsageError(f"reading with {name} needs the {name} package: pip install 'shardsink[{name}]' "
                                 f"({e})") from e


def engine_available(name: str) -> bool:
    """Whether ``name`` (``duckdb`` or ``polars``) can be imported."""
    try:
        check_engine(name)
    except InvalidUsageError:
        return False
    return True



def duckdb(con: _duckdb.DuckDBPyConnection, url: str, as_of: int | None = None, *,
           changes: tuple[int, int] | None = None, holder: str | None = None,
           ttl_s: float = DEFAULT_TTL_S, schema: SchemaChoice = "current") -> LeasedRead[_duckdb.DuckDBPyRelation]:
    """The consolidated snapshot at ``as_of`` (default ``upper - 1``; user columns + ``_count``)
    or, with ``changes=(lower, upper)``, the update feed ``[lower, upper)`` (user columns +
    ``_time`` + ``_diff``) of the shard at ``url``, as a lazy relation on ``con``, leased
    (module docstring). User columns: the shard's current schema, or with ``schema="as_of"``
    the one current at the read's time (as :meth:`shardsink.Shard.snapshot`). Frontier errors
    and a bad ``schema`` are raised here, before any lease is left behind.
    """
    check_engine("duckdb")
    from shardsink.read import duckdb_read

    duckdb_read.check_connection(con)
    plan, lease = open_plan(url, as_of, changes=changes, holder=holder, ttl_s=ttl_s,
                            schema=schema)
    try:
        rel = duckdb_read.relation(con, plan)
    except BaseException:
        lease.close()
        raise
    return LeasedRead(rel, plan, lease)


def polars(url: str, as_of: int | None = None, *, changes: tuple[int, int] | None = None,
           holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
           schema: SchemaChoice = "current") -> LeasedRead[_polars.LazyFrame]:
    """:func:`duckdb` as a Polars ``LazyFrame`` (same columns, same lease contract)."""
    check_engine("polars")
    from shardsink.read import polars_read

    plan, lease = open_plan(url, as_of, changes=changes, holder=holder, ttl_s=ttl_s,
                            schema=schema)
    try:
        lf = polars_read.frame(plan)
    except BaseException:
        lease.close()
        raise
    return LeasedRead(lf, plan, lease)
