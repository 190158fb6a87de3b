"""Reading a landing description from the mint's plan, in bounded memory.

A write slot with a plan (:mod:`shardsink.sources.landing.index`) reads only its files whose
event times overlap ``[lower, upper)`` and the files the mint could not index; the late check
of every other file of the slot holding earlier times uses the plan's (the index's) earliest
time and first-seen time, so old files are never read again.

Memory: a Parquet file is read one row group at a time through ranged reads (the footer, then
each row group's byte range in one request), row groups whose event-time statistics lie
outside the window skipped; a CSV / JSONL file in blocks (:data:`shardsink.storage.ranged.BLOCK`
bytes a request), each block checked and filtered before the next. Every ranged read checks
that the file is still the one listed (size and mtime locally, the ETag on S3): a file changed
or deleted since the mint's listing is refused (MalformedInputError), never half read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardsink.core.updates import TIME
from shardsink.sources.base import Seal, is_connect, map_on_executors, spread_rows
from shardsink.sources.evolution import SchemaMode
from shardsink.sources.landing.files import (
    LandingFile,
    MalformedInputError,
    check_late,
    check_late_at,
    read_landing_file,
    shape_rows,
    slot_of,
)
from shardsink.sources.landing.index import (
    FilePlan,
    chunk_range,
    group_times,
    time_column_index,
    version_of,
)
from shardsink.sources.landing.partitions import check_in_day
from shardsink.storage.ranged import RangedFile, SourceChangedError
from shardsink.storage.url import open_blob, parse_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def stream_rows(blob: Any, f: LandingFile, schema: pa.Schema, time_column: str, *, root: str,
                schema_mode: SchemaMode = "strict", window: tuple[int, int]) -> Iterator[pa.Table]:
    """The rows of ``f`` in ``window`` as user columns + ``_time``, block by block (see the
    module docstring); MalformedInputError names the file."""
    where = f"{root}/{f.key}"
    fmt = f.key.lower().rsplit(".", 1)[-1]
    rf = RangedFile(blob, f.key, version_of(f))
    lower, upper = window
    try:
        for t in (_parquet_blocks(rf, time_column, window) if fmt == "parquet" else _text_blocks(rf, fmt, schema)):
            rows = shape_rows(t, schema, time_column, where=where, schema_mode=schema_mode, window=window)
            keep = rows.filter(pc.and_(pc.greater_equal(rows[TIME], lower), pc.less(rows[TIME], upper)))
            if keep.num_rows:
                yield keep
    except SourceChangedError as e:
        raise MalformedInputError(f"{where} changed or disappeared since it was listed ({e}); landed files must "
                                  "never be changed in place or removed") from e
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as e:
        raise MalformedInputError(f"{where} is unreadable as {fmt}: {e}") from e


def _parquet_blocks(rf: RangedFile, time_column: str, window: tuple[int, int]) -> Iterator[pa.Table]:
    pf = pq.ParquetFile(rf, pre_buffer=False)
    md = pf.metadata
    col = time_column_index(md, time_column)
    field = pf.schema_arrow.field(time_column) if time_column in pf.schema_arrow.names else None
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        got = group_times(rg, col, field) if col is not None and field is not None else None
        if got is not None and (got[1] < window[0] or got[0] >= window[1]):
            continue  # every row of the group is outside the window (statistics without nulls)
        rf.prefetch(*chunk_range(rg, range(rg.num_columns)))
        t = pf.read_row_group(i, use_threads=False)
        rf.drop()
        yield t
    if md.num_row_groups == 0:
        yield pf.schema_arrow.empty_table()


def _text_blocks(rf: RangedFile, fmt: str, schema: pa.Schema) -> Iterator[pa.Table]:
    if fmt == "csv":
        types = {c.name: c.type for c in schema}
        reader = pacsv.open_csv(rf, convert_options=pacsv.ConvertOptions(column_types=types))
    else:
        reader = pajson.open_json(rf, parse_options=pajson.ParseOptions(explicit_schema=schema,
                                                                         unexpected_field_behavior="infer"))
    for b in reader:
        yield pa.Table.from_batches([b])


def read_planned(spark: SparkSession, plan: FilePlan, *, slot: int, slots: int, schema: pa.Schema,
                 seals: Sequence[Seal], schema_mode: SchemaMode, spark_schema: Any, partitions: str | None = None
                 ) -> tuple[DataFrame, list[dict[str, Any]]]:
    """:meth:`shardsink.sources.landing.LandingSource.read_slot` from the mint's plan (see the
    module docstring): the plan names the landing root and event-time column. ``partitions``: the
    declared day-folder layout, whose files must hold only their day's times
    (:func:`shardsink.sources.landing.partitions.check_in_day`, from the index: no read)."""
    lower, root = plan.lower, plan.root
    read = [e for e in plan.read if slot_of(e.key, slots) == slot]
    unindexed = [u for u in plan.unindexed if slot_of(u.key, slots) == slot]
    for e in read:
        if e.tmin is not None and e.tmax is not None:
            if partitions:
                check_in_day(partitions, e.key, e.tmin, e.tmax, root=root)
            check_late_at(e.tmin, e.key, e.first_seen, lower=lower, seals=seals, root=root)
    for o in plan.older:
        if slot_of(o.key, slots) == slot:
            if partitions:
                check_in_day(partitions, o.key, o.tmin, o.tmax, root=root)
            check_late_at(o.tmin, o.key, o.first_seen, lower=lower, seals=seals, root=root)
    rows = [(e.key, e.size, e.modified, e.identity, True) for e in read]
    rows += [(u.key, u.size, u.modified, u.identity, False) for u in unindexed]
    listing = [{"key": k, "size": size, "modified": m} for k, size, m, _, _ in rows]
    if not rows:
        return spark.createDataFrame([], spark_schema), listing
    read_rows = _file_reader(plan, schema=schema, seals=seals, schema_mode=schema_mode)
    if is_connect(spark) and sum(r[1] for r in rows) <= IN_CLIENT_BYTES:
        got = list(read_rows([dict(zip(_WORK, r, strict=True)) for r in rows]))
        out = pa.schema([*schema, pa.field(TIME, pa.int64())])
        table = pa.Table.from_batches([b.cast(out) for b in got], schema=out)  # each file's batches as read
        return spark.createDataFrame(table, spark_schema), listing

    def read_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield from read_rows(b.to_pylist())

    files_df = spread_rows(spark, rows, _WORK_DDL)
    return map_on_executors(files_df, read_files, spark_schema), listing


#: A Spark Connect write slot whose files hold at most this many bytes in all is read by the client
#: (the write task's process, with the same code as the executors) and sent to the server in the
#: plan (an Arrow local relation; the server caches one past 64 MiB): the server then runs no Python
#: for the slot (starting a session's Python worker daemon costs it ~1.5 CPU-s; issue 45).
IN_CLIENT_BYTES = 4 << 20
#: The work list's columns: one row per file (:func:`read_planned`), read by :func:`_file_reader`.
_WORK_DDL = "key string, size long, modified double, identity string, indexed boolean"
_WORK = tuple(column.split()[0] for column in _WORK_DDL.split(", "))


def _file_reader(plan: FilePlan, *, schema: pa.Schema, seals: Sequence[Seal], schema_mode: SchemaMode
                 ) -> Callable[[Iterable[dict[str, Any]]], Iterator[pa.RecordBatch]]:
    """The rows of the work list's files (dicts of :data:`_WORK`) inside the plan's window, as
    batches of user columns + ``_time``: indexed files streamed (:func:`stream_rows`), the others
    read whole and checked for late rows. Runs on the executors or in the client: plain values only."""
    lower, upper, root, time_column = plan.lower, plan.upper, plan.root, plan.time_column
    seal_list = list(seals)
    schema_bytes = schema.serialize().to_pybytes()

    def read_rows(rows: Iterable[dict[str, Any]]) -> Iterator[pa.RecordBatch]:
        blob = open_blob(parse_url(root))
        user = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
        for row in rows:
            f = LandingFile(row["key"], row["size"], row["modified"], row["identity"])
            if row["indexed"]:
                for t in stream_rows(blob, f, user, time_column, root=root, schema_mode=schema_mode,
                                     window=(lower, upper)):
                    yield from t.to_batches()
                continue
            t = read_landing_file(blob, f, user, time_column, root=root, schema_mode=schema_mode,
                                  window=(lower, upper))
            check_late(t, f, lower=lower, seals=seal_list, root=root)
            keep = pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper))
            yield from t.filter(keep).to_batches()

    return read_rows
