"""One landing file at a time: reading it (whole, or its schema), shaping its rows onto the
shard's columns, its writer slot, and the late-file check (see :mod:`shardsink.sources.landing`
for the convention and the late-data contract). Everything here works on one file and a blob; the
source, its index and its plans build on it (:mod:`shardsink.sources.landing.index`,
:mod:`shardsink.sources.landing.read`).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardsink.core.updates import DIFF, TIME, validate_updates
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Seal
from shardsink.sources.evolution import STRICT_HINT, SchemaMode, conform
from shardsink.storage.base import Blob, ObjectInfo


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


def file_of(o: ObjectInfo) -> LandingFile:
    return LandingFile(o.key, o.size, o.modified, o.identity)


def to_millis(col: pa.ChunkedArray, *, where: str, name: str) -> pa.ChunkedArray:
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
    return shape_rows(read_data_file(blob, f.key, schema, where=where), schema, time_column, where=where,
                      schema_mode=schema_mode, window=window)


def shape_rows(t: pa.Table, schema: pa.Schema | None, time_column: str, *, where: str,
               schema_mode: SchemaMode = "strict", window: tuple[int, int] | None = None) -> pa.Table:
    """Rows of a landing file (all of it, or one block of it) as user columns + ``_time``:
    :func:`read_landing_file` after the read. MalformedInputError names ``where``."""
    if time_column not in t.column_names:
        raise MalformedInputError(f"{where} has no event-time column {time_column!r} (columns: {t.column_names})")
    time = to_millis(t.column(time_column), where=where, name=time_column)
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
    check_late_at(pc.min(t[TIME]).as_py(), f.key, f.modified, lower=lower, seals=seals, root=root)


def check_late_at(tmin: int, key: str, appeared: float, *, lower: int, seals: Sequence[Seal], root: str) -> None:
    """:func:`check_late` from a file's earliest time and when it appeared (the landed-file
    index's min time and first-seen time: no read).

    The rule: a file is late when its earliest time ``tmin`` (below ``lower``) was sealed by a
    commit whose listing it was not in: it appeared at or after that listing's time (equal
    whole seconds count as late) and the listing does not hold it (:class:`Seal`). Times no
    commit has sealed yet (at or above the newest seal's upper: a description minted ahead
    reads files of earlier, still open days) are never late: their own run reads them.
    """
    if tmin >= lower or not seals:
        return
    # The NEWEST seal of tmin decides: a re-processing correction re-seals its range (see
    # shardsink.sinks.seals.seals), so a file re-landed before it is not late.
    seal = max((s for s in seals if s.lower <= tmin < s.upper), key=lambda s: s.at, default=None)
    if seal is None:
        if tmin >= max(s.upper for s in seals):
            return  # not sealed yet
        # Older than every seal given (seals() covers every time with a horizon seal; a
        # caller's own list may not): the oldest sealing commit given came no earlier than
        # the true one, so "newer than it" still proves lateness.
        seal = min(seals, key=lambda s: s.lower)
    if appeared >= seal.at and (key, appeared) not in seal.held:
        raise LateDataError(
            f"late file {root}/{key}: its earliest event time {tmin} was sealed by commit seqno {seal.seqno} "
            f"(times [{seal.lower}, {seal.upper})) as of a listing at {seal.at:.3f} that did not hold the file, "
            f"which appeared at {appeared:.3f}; it cannot be ingested exactly once. "
            "Move it out of the landing zone or re-land its rows with current times.",
            value=tmin,
        )
