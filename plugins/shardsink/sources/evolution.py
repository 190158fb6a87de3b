"""Source files that change shape: the ingest sink's ``schema_mode`` (as delta-rs's).

* ``"strict"`` (the default): a source file's columns must be the shard's (types may be
  narrower where the shard's read casts them exactly); any other file is refused by the
  write job, naming the file and its missing and unexpected columns. Nothing commits.
* ``"add_columns"``: before a batch is written, the mint task reads the schema of every
  file the write jobs will read (:meth:`LandingSource.file_schemas`) and evolves the shard
  (:mod:`shardsink.sinks.evolve`) so that it holds all of them: a new column is added
  nullable, a column whose type widens (:func:`shardsink.core.schema.widens`) is widened.
  Anything else (an incompatible type, a narrowing the read cannot cast exactly, a
  required shard column a file lacks) is a :class:`SchemaMismatchError` naming the file,
  the column, both types and what is allowed, raised before anything is written. The write
  jobs then read each file onto the shard's schema (:func:`conform`): columns a file lacks
  read as nulls, narrower types are cast.

The schemas of the files a run will read come through one function, :func:`run_file_schemas`
(the mint's evolution, a dry run; the DAG factory checks the source with :func:`file_schemas_of`).
Everything else here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, Protocol, cast

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core import schema as sc
from shardsink.core.schema import SchemaChange, parse_type, widens
from shardsink.core.updates import TIME
from shardsink.errors import InvalidUsageError

SchemaMode = Literal["strict", "add_columns"]
SCHEMA_MODES: tuple[SchemaMode, ...] = ("strict", "add_columns")

_ALLOWED = ("add a nullable column, or widen int8 -> int16 -> int32 -> int64, float -> double, "
            "decimal128(p,s) -> decimal128(p2,s) with p2 > p, string -> large_string")


#: Appended to strict mode's refusal of a file with columns the shard does not know.
STRICT_HINT = ("; the shard's schema is strict (ingest_dag(schema_mode='add_columns') adds new nullable columns, "
               "or add them with `shardsink schema URL --add NAME:TYPE`)")


class FileSchemas(Protocol):
    """A file source's ``file_schemas``: ``(where, user columns)`` of every file its write jobs
    read (:meth:`shardsink.sources.landing.LandingSource.file_schemas`)."""

    def __call__(self, schema: pa.Schema | None = None, /, **index: str) -> Iterable[tuple[str, pa.Schema]]: ...


class SchemaMismatchError(InvalidUsageError):
    """A source file's columns cannot be held by the shard under the DAG's ``schema_mode``:
    fix the file (or evolve the shard by hand with ``shardsink schema``); nothing was written."""


def check_schema_mode(mode: object) -> SchemaMode:
    """``mode`` if it is one of :data:`SCHEMA_MODES`, else InvalidUsageError naming it."""
    if not isinstance(mode, str) or mode not in SCHEMA_MODES:
        raise InvalidUsageError(f"schema_mode must be 'strict' or 'add_columns', got {mode!r:.120}",
                                value=str(mode)[:120])
    return mode  # type: ignore[return-value]


def read_kwargs(mode: SchemaMode) -> dict[str, SchemaMode]:
    """The ``schema_mode`` keyword of a source's ``read_slot`` for ``mode``: none for
    ``"strict"`` (every source reads so; one without schema modes takes no such keyword)."""
    return {} if check_schema_mode(mode) == "strict" else {"schema_mode": mode}


def _reads_exactly(file_type: pa.DataType, shard_type: pa.DataType) -> bool:
    """Whether a file column of ``file_type`` reads into a shard column of ``shard_type`` by
    the write job's cast (same type, a widening, or the ingest read's int/float/string casts,
    which refuse a value that does not fit)."""
    if file_type == shard_type or widens(file_type, shard_type) or pa.types.is_null(file_type):
        return True
    return bool((pa.types.is_integer(file_type) and pa.types.is_integer(shard_type))
                or (pa.types.is_floating(file_type) and pa.types.is_floating(shard_type))
                or (pa.types.is_large_string(file_type) and pa.types.is_string(shard_type)))


def _addable(t: pa.DataType) -> bool:
    try:
        return parse_type(str(t)) == t
    except InvalidUsageError:
        return False


def evolved(schema: pa.Schema, file_schema: pa.Schema, *, where: str) -> pa.Schema:
    """``schema`` grown to hold the rows of a file with user columns ``file_schema``: its new
    columns appended (nullable, in the file's order), its wider types taken.
    SchemaMismatchError naming ``where`` and the column for anything else. Pure."""
    out = schema
    for f in file_schema:
        i = out.get_field_index(f.name)
        if i < 0:
            if pa.types.is_null(f.type) or not _addable(f.type):
                raise SchemaMismatchError(
                    f"{where}: new column {f.name!r} has type {f.type}, which cannot be added to the shard "
                    "(expected a pyarrow type alias such as int64, string, double, timestamp[ms], decimal128(12,2); "
                    "an all-null column has no type)", value=f.name)
            out = out.append(pa.field(f.name, f.type, True))
            continue
        old = out.field(i)
        if widens(old.type, f.type):
            out = out.set(i, old.with_type(f.type))
        elif not _reads_exactly(f.type, old.type):
            raise SchemaMismatchError(
                f"{where}: column {f.name!r} has type {f.type}; the shard's is {old.type}, and changing it "
                f"is not allowed (allowed: {_ALLOWED})", value=f.name)
    missing = [f.name for f in out if not f.nullable and f.name not in file_schema.names]
    if missing:
        raise SchemaMismatchError(f"{where}: lacks the shard's required (non-nullable) columns {missing}; only "
                                  "nullable columns may be absent from a file", value=missing[0])
    return out


def target_schema(schema: pa.Schema, files: Iterable[tuple[str, pa.Schema]]) -> pa.Schema:
    """``schema`` grown to hold every file of ``files`` (``(where, user columns)``, in order),
    by :func:`evolved`; the first file that cannot be held raises, naming it and the column."""
    out = schema
    for where, fs in files:
        out = evolved(out, fs, where=where)
    return out


def changes_to(schema: pa.Schema, target: pa.Schema, *, what: str) -> list[SchemaChange]:
    """The schema changes (adds, then widenings, by column order) that take the shard's
    ``schema`` to hold ``target``'s columns (:func:`shardsink.core.schema.changes_to`, what
    the commit applies); none when it holds them already. SchemaMismatchError naming the
    column when ``schema`` cannot get there (``what``: who wants it)."""
    plan = sc.changes_to(schema, target)
    if isinstance(plan, sc.Clash):
        raise mismatch(what, plan.describe(), column=plan.name)
    return list(plan)


def mismatch(what: str, reason: str, *, column: str) -> SchemaMismatchError:
    """The refusal of an evolution for ``what`` whose target the shard cannot reach (``reason``:
    :meth:`shardsink.core.schema.Clash.describe`, or the commit's SchemaConflict)."""
    return SchemaMismatchError(f"{what} {reason} (changed meanwhile by another evolver?); refused (allowed: "
                               f"{_ALLOWED})", value=column)


def file_schemas_of(source: object) -> FileSchemas:
    """``source.file_schemas``: the one test of whether ``source`` can tell its files' schemas;
    InvalidUsageError naming the source otherwise (``schema_mode="add_columns"`` needs a file
    source)."""
    files = getattr(source, "file_schemas", None)
    if not callable(files):
        kind = getattr(source, "kind", type(source).__name__)
        raise InvalidUsageError(f"schema_mode 'add_columns' needs a file source (landing, files) that can tell its "
                                f"files' schemas; source {kind!r} cannot", value=kind)
    return cast(FileSchemas, files)


def run_file_schemas(source: object, schema: pa.Schema, *, shard_url: str,
                     desc_id: str | None = None) -> Iterator[tuple[str, pa.Schema]]:
    """The schemas of the files this run will read, ``(where, user columns)``: the ONE protocol
    the mint's evolution, a dry run and the DAG factory's check go through. ``schema`` pins
    the types of the columns it names (CSV / JSONL). A source that indexes its files
    (``prepare_chain``) reads them from ``shard_url``'s landed-file index (new files only),
    and with ``desc_id`` (the chain the mint just prepared) from that mint's listing; nothing
    is written. InvalidUsageError for a source that cannot tell (:func:`file_schemas_of`)."""
    files = file_schemas_of(source)
    if getattr(source, "prepare_chain", None) is None:
        return iter(files(schema))
    return iter(files(schema, shard_url=shard_url, **({"desc_id": desc_id} if desc_id is not None else {})))


def conform(t: pa.Table, schema: pa.Schema, *, where: str, window: tuple[int, int] | None = None) -> pa.Table:
    """A file's table (user columns, maybe ``_time``) read onto the shard's ``schema``, for
    ``add_columns`` reads: shard columns the file lacks are added as nulls (the
    nullable ones; a required one is refused), narrower decimals are cast up; a column the
    shard does not know is dropped only if no row falls in ``window`` (``[lower, upper)`` of
    ``_time``), else SchemaMismatchError naming the file and column (it landed after the mint
    evolved the shard: the next run adds it). Column order: ``schema``'s, then ``_time``."""
    extra = [n for n in t.column_names if n != TIME and n not in schema.names]
    if extra:
        rows = t.num_rows if window is None or TIME not in t.column_names else pc.sum(pc.and_(
            pc.greater_equal(t[TIME], window[0]), pc.less(t[TIME], window[1]))).as_py() or 0
        if rows:
            raise SchemaMismatchError(
                f"{where}: has columns {extra} the shard does not know ({rows} of its rows are in this batch); "
                "it landed after this run's mint evolved the shard: clear the run to add them", value=extra[0])
        t = t.drop_columns(extra)
    cols, names = [], []
    for f in schema:
        if f.name in t.column_names:
            col = t[f.name]
            cols.append(col.cast(f.type) if col.type != f.type and widens(col.type, f.type) else col)
        elif f.nullable:
            cols.append(pa.nulls(t.num_rows, f.type))
        else:
            raise SchemaMismatchError(f"{where}: lacks the shard's required column {f.name!r} ({f.type})",
                                      value=f.name)
        names.append(f.name)
    if TIME in t.column_names:
        cols.append(t[TIME])
        names.append(TIME)
    return pa.Table.from_arrays(cols, names=names)
