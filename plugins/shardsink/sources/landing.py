"""The landing-zone source: Parquet / CSV / JSONL files under a folder or S3 prefix.

Convention (docs/landing-zone.md): data files ``*.parquet``, ``*.csv``, ``*.jsonl``
anywhere under ``root``, each with an event-time column (int64 ms since the epoch, or
a timestamp); ``root/_watermark.json`` = ``{"watermark": <ms>}`` published by the
producer once every file with event times below it has landed. Names starting with
``_`` or ``.`` are not data.

Files are assigned to writer slots by a stable hash of their key, and read on the
executors with pyarrow through the shardsink storage layer (local folder or S3 via
boto3), so no hadoop-aws jars are needed.

SUBTLE (late data): a file may hold times below the description's lower. That is fine
when the file was already there when those times were sealed (its rows were ingested
then and are filtered out now). A file that appeared *after* the commit sealing its
earliest time broke the watermark contract; its rows can never be ingested
exactly once, so the job refuses it, naming the file, its earliest time and the
sealing commit. The check compares the file's modification time with the commit time
of that seal, so it relies on the store's clock and the writer's clock agreeing to
within the gap between landing and commit.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardsink.core.state_codec import schema_from_json, schema_to_json
from shardsink.core.updates import DIFF, TIME, user_schema, validate_updates
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Seal, map_on_executors
from shardsink.sources.evolution import STRICT_HINT, SchemaMode, conform
from shardsink.specs import LandingSpec, spec_as, spec_to_builtins
from shardsink.storage.base import Blob, ObjectInfo
from shardsink.storage.url import ShardUrl, open_blob, parse_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WATERMARK_KEY = "_watermark.json"
SUFFIXES = (".parquet", ".csv", ".jsonl")


class MalformedInputError(InvalidUsageError):
    """A source file cannot be read as the shard's rows (unreadable, bad columns, null times)."""


class LateDataError(InvalidUsageError):
    """A source file holds event times that were sealed before the file appeared."""


@dataclass(frozen=True)
class LandingFile:
    key: str  # relative to the landing root
    size: int
    modified: float  # epoch seconds (mtime / S3 LastModified)
    identity: str = ""  # ObjectInfo.identity: the S3 ETag; "" on a local folder (only a read gives it)


def slot_of(key: str, slots: int) -> int:
    """The writer slot of a file: stable across processes, hosts and Python versions."""
    return zlib.crc32(key.encode()) % slots


def parse_columns(columns: Mapping[str, str]) -> pa.Schema:
    """``{"user": "string", "n": "int64"}`` → an Arrow schema (pyarrow type aliases)."""
    try:
        return pa.schema([pa.field(name, pa.type_for_alias(t)) for name, t in columns.items()])
    except (ValueError, KeyError) as e:
        raise InvalidUsageError(f"landing columns {dict(columns)!r}: {e}") from e


class LandingSource:
    """Files under ``root`` (a path, ``file://`` or ``s3://`` URL) with an event-time column."""

    kind = "landing"
    spec_type = LandingSpec

    def __init__(self, root: str, *, time_column: str = "event_time", schema: pa.Schema | None = None) -> None:
        self.url: ShardUrl = parse_url(root)
        self.root = str(self.url)
        self.time_column = time_column
        self._schema = schema

    # --- spec -----------------------------------------------------------------------

    def typed_spec(self) -> LandingSpec:
        """The spec as data (:mod:`shardsink.specs`)."""
        schema = schema_to_json(self._schema) if self._schema is not None else None
        return LandingSpec(root=self.root, time_column=self.time_column, schema=schema)

    def spec(self) -> dict[str, Any]:
        """The spec's dict layout (what DAG settings and executors carry)."""
        return spec_to_builtins(self.typed_spec())

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | LandingSpec) -> LandingSource:
        s = spec_as(spec, LandingSpec)
        schema = None
        if s.schema is not None:
            schema = schema_from_json(s.schema)
        elif s.columns is not None:
            schema = parse_columns(s.columns)
        return cls(s.root, time_column=s.time_column, schema=schema)

    def blob(self) -> Blob:
        return open_blob(self.url)

    # --- driver side ------------------------------------------------------------------

    def watermark(self) -> int | None:
        got = self.blob().get(WATERMARK_KEY)
        if got is None:
            return None
        try:
            wm = json.loads(got.data)["watermark"]
        except (ValueError, KeyError, TypeError) as e:
            raise MalformedInputError(
                f"{self.root}/{WATERMARK_KEY} is malformed: {e}; expected {{\"watermark\": <ms>}}"
            ) from e
        if not isinstance(wm, int) or isinstance(wm, bool):
            raise MalformedInputError(f"{self.root}/{WATERMARK_KEY}: watermark {wm!r} is not integer milliseconds")
        return wm

    def files(self) -> list[LandingFile]:
        """Every data file under the root, sorted by key."""
        out = []
        for o in self.blob().list(""):
            name = o.key.rsplit("/", 1)[-1]
            if name.startswith(("_", ".")) or not name.lower().endswith(SUFFIXES):
                continue
            out.append(_file(o))
        return sorted(out, key=lambda f: f.key)

    def schema(self) -> pa.Schema | None:
        """The declared columns, or those of the first data file (minus the event time)."""
        if self._schema is not None:
            return self._schema
        files = self.files()
        if not files:
            return None
        t = read_landing_file(self.blob(), files[0], None, self.time_column)
        return user_schema(t.schema)

    def file_schemas(self, schema: pa.Schema | None = None) -> Iterator[tuple[str, pa.Schema]]:
        """``(where, user columns)`` of every data file the write jobs read (all of them, by key),
        the event-time column left out; ``schema`` pins the types of the columns it names in
        CSV / JSONL files. Reads each file (a Parquet file's footer is parsed, not its rows):
        the cost of ``schema_mode="add_columns"``'s check at mint. MalformedInputError names a
        file that cannot be read."""
        blob = self.blob()
        for f in self.files():
            where = f"{self.root}/{f.key}"
            fs = read_file_schema(blob, f.key, schema, where=where)
            if self.time_column not in fs.names:
                raise MalformedInputError(f"{where} has no event-time column {self.time_column!r} "
                                          f"(columns: {fs.names})")
            yield where, fs.remove(fs.get_field_index(self.time_column))

    def read_slot(
        self,
        spark: SparkSession,
        *,
        lower: int,
        upper: int,
        slot: int,
        slots: int,
        schema: pa.Schema,
        seals: Sequence[Seal] = (),
        schema_mode: SchemaMode = "strict",
    ) -> tuple[DataFrame, list[dict[str, Any]]]:
        """The slot's rows in ``[lower, upper)`` (see :class:`shardsink.sources.base.Source`);
        ``schema_mode``: how files are read onto ``schema`` (:mod:`shardsink.sources.evolution`)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        mine = [f for f in self.files() if slot_of(f.key, slots) == slot]
        listing = [{"key": f.key, "size": f.size, "modified": f.modified} for f in mine]
        out_schema = pa.schema([*schema, pa.field(TIME, pa.int64())])
        spark_schema = from_arrow_schema(out_schema)
        if not mine:
            return spark.createDataFrame([], spark_schema), listing
        spec, time_column, seal_list = self.spec(), self.time_column, list(seals)
        schema_bytes = schema.serialize().to_pybytes()

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            # Runs on executors: rebuild what it needs from plain values.
            src = LandingSource.from_spec(spec)
            blob = src.blob()
            user = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
            for b in batches:
                for row in b.to_pylist():
                    f = LandingFile(row["key"], row["size"], row["modified"])
                    t = read_landing_file(blob, f, user, time_column, root=src.root, schema_mode=schema_mode,
                                          window=(lower, upper))
                    check_late(t, f, lower=lower, seals=seal_list, root=src.root)
                    keep = pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper))
                    yield from t.filter(keep).to_batches()

        n = max(1, min(len(mine), spark.sparkContext.defaultParallelism * 2))
        rdd = spark.sparkContext.parallelize([(f.key, f.size, f.modified) for f in mine], n)
        files_df = spark.createDataFrame(rdd, "key string, size long, modified double")
        return map_on_executors(files_df, read, spark_schema), listing


def _file(o: ObjectInfo) -> LandingFile:
    return LandingFile(o.key, o.size, o.modified, o.identity)


def _to_millis(col: pa.ChunkedArray, *, where: str, name: str) -> pa.ChunkedArray:
    if pa.types.is_null(col.type):
        raise MalformedInputError(f"{where}: {len(col)} rows have a null event time in {name!r}")
    if pa.types.is_integer(col.type):
        return col.cast(pa.int64())
    if pa.types.is_timestamp(col.type):
        return col.cast(pa.timestamp("ms", tz=col.type.tz)).cast(pa.int64())
    if pa.types.is_date(col.type):
        return col.cast(pa.date64()).cast(pa.int64())
    raise MalformedInputError(
        f"{where}: event-time column {name!r} has type {col.type}; expected int64 milliseconds or a timestamp"
    )


def read_data_file(blob: Blob, key: str, schema: pa.Schema | None, *, where: str,
                   size: int | None = None, identity: str = "") -> pa.Table:
    """Read one Parquet / CSV / JSONL file as it is (format from the key's suffix).

    ``key`` is a source key: whatever the store allows (``Blob.get_source``). ``schema``
    pins the types of the columns it names (CSV, JSONL). ``size`` and ``identity``: what
    the file was when it was bound (``identity`` is checked with
    :meth:`shardsink.storage.base.SourceObject.matches`; "" for bindings made before
    identities were recorded, which check the size only); a file that differs was changed
    in place (refused). Raises MalformedInputError naming ``where``.
    """
    try:
        got = blob.get_source(key)
    except InvalidUsageError as e:  # a key no store can hold: the file is unreadable, not the call
        raise MalformedInputError(f"{where}: {e}") from e
    if got is None:
        raise MalformedInputError(f"{where} disappeared while reading; landed files must never be removed")
    if size is not None and len(got.data) != size:
        raise MalformedInputError(
            f"{where} has {len(got.data)} bytes, not the {size} it had when it was bound; landed files must "
            "never be changed in place")
    if identity and not got.matches(identity):
        raise MalformedInputError(
            f"{where} was rewritten after it was bound (identity {got.identity!r}, bound as {identity!r}); "
            "landed files must never be changed in place")
    fmt = key.lower().rsplit(".", 1)[-1]
    try:
        if fmt == "parquet":
            return pq.read_table(pa.BufferReader(got.data))
        if fmt == "csv":
            types = {c.name: c.type for c in schema} if schema is not None else None
            return pacsv.read_csv(io.BytesIO(got.data), convert_options=pacsv.ConvertOptions(column_types=types))
        parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer") if schema else None
        return pajson.read_json(io.BytesIO(got.data), parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as e:
        raise MalformedInputError(f"{where} is unreadable as {fmt}: {e}") from e


def read_file_schema(blob: Blob, key: str, schema: pa.Schema | None, *, where: str) -> pa.Schema:
    """The columns of one data file (a Parquet file's from its footer; CSV / JSONL parsed, the
    columns ``schema`` names pinned to its types); MalformedInputError naming ``where``."""
    if key.lower().endswith(".parquet"):
        got = blob.get_source(key)
        if got is None:
            raise MalformedInputError(f"{where} disappeared while reading; landed files must never be removed")
        try:
            return pq.read_schema(pa.BufferReader(got.data))
        except (pa.ArrowInvalid, OSError) as e:
            raise MalformedInputError(f"{where} is unreadable as parquet: {e}") from e
    return read_data_file(blob, key, schema, where=where).schema


def read_landing_file(
    blob: Blob, f: LandingFile, schema: pa.Schema | None, time_column: str, *, root: str | None = None,
    schema_mode: SchemaMode = "strict", window: tuple[int, int] | None = None,
) -> pa.Table:
    """Read one landing file as user columns + ``_time``; MalformedInputError names the file.

    ``schema`` (the shard's user columns) pins types and the exact column set; None
    keeps what the file has (used to infer a schema). ``schema_mode="add_columns"``: the
    file is read onto ``schema`` instead (:func:`shardsink.sources.evolution.conform`:
    missing nullable columns as nulls; a column the shard does not know is refused only if
    the file has rows in ``window``, the batch's ``[lower, upper)``).
    """
    where = f"{root or blob.url}/{f.key}"
    t = read_data_file(blob, f.key, schema, where=where)
    if time_column not in t.column_names:
        raise MalformedInputError(f"{where} has no event-time column {time_column!r} (columns: {t.column_names})")
    time = _to_millis(t.column(time_column), where=where, name=time_column)
    if time.null_count:
        raise MalformedInputError(f"{where}: {time.null_count} rows have a null event time in {time_column!r}")
    t = t.drop_columns([time_column])
    if schema is not None and schema_mode == "add_columns":
        t = conform(t.append_column(TIME, time), schema, where=where, window=window)
        try:
            return validate_updates(t, schema, lower=-(2**63), upper=None).drop_columns([DIFF])
        except InvalidUsageError as e:
            raise MalformedInputError(f"{where}: {e}") from e
    if schema is not None:
        missing = [n for n in schema.names if n not in t.column_names]
        extra = [n for n in t.column_names if n not in schema.names]
        if missing or extra:
            raise MalformedInputError(
                f"{where}: columns do not match the shard: missing {missing}, unexpected {extra}"
                f"{STRICT_HINT if extra else ''}", value=(extra or missing)[0]
            )
        try:
            t = validate_updates(t.append_column(TIME, time), schema, lower=-(2**63), upper=None)
        except InvalidUsageError as e:
            raise MalformedInputError(f"{where}: {e}") from e
        return t.drop_columns([DIFF])
    return t.append_column(TIME, time)


def check_late(t: pa.Table, f: LandingFile, *, lower: int, seals: Sequence[Seal], root: str) -> None:
    """Raise LateDataError if ``f`` holds times ``< lower`` that were sealed before it appeared."""
    if t.num_rows == 0:
        return
    tmin = pc.min(t[TIME]).as_py()
    if tmin >= lower:
        return
    # The NEWEST seal of tmin decides: a re-processing correction re-seals its range (see
    # shardsink.sinks.seals.seals), so a file re-landed before it is not late.
    seal = max((s for s in seals if s.lower <= tmin < s.upper), key=lambda s: s.at, default=None)
    if seal is None and seals:
        # Older than every seal given (seals() covers every time with a horizon seal; a
        # caller's own list may not): the oldest sealing commit given came no earlier than
        # the true one, so "newer than it" still proves lateness.
        seal = min(seals, key=lambda s: s.lower)
    if seal is not None and f.modified > seal.at:
        raise LateDataError(
            f"late file {root}/{f.key}: its earliest event time {tmin} was sealed by commit seqno {seal.seqno} "
            f"(times [{seal.lower}, {seal.upper})) before the file appeared; it cannot be ingested exactly once. "
            "Move it out of the landing zone or re-land its rows with current times.",
            value=tmin,
        )
