"""The landed-file index and the mint's file plans: a run reads its own data, not the zone's history.

**The index** (``landing/index.json`` in the data shard, :mod:`shardsink.sources.landing.layout`)
records per landed file: key, size, listed modification time, listed identity (the S3 ETag;
"" on a local folder), format, row count, event-time min / max, schema fingerprint (the
schemas themselves once each) and ``first_seen`` (the modification time when it was indexed:
when it appeared). An entry is built once, from a Parquet footer's statistics (ranged reads:
the footer, plus the event-time column's chunks where statistics are missing) or from one
streaming pass over a CSV / JSONL file, and is kept while the listing shows the same file
(size, and the ETag on S3 or the mtime locally). A file the listing shows changed is indexed
again, as a file that appeared now (its ``first_seen`` moves, so the late check judges the
re-landing as it always did). A file that cannot be indexed (unreadable, no or null event
times) is left out: the write job reads it whole and refuses it as before.

The index is a cache: a missing, unreadable or foreign (another root or time column) index
costs one re-scan, never wrong data. It is stored as a base document plus small delta
segments, so a run writes only its new entries (:mod:`shardsink.sources.landing.index_store`:
the layout, consolidation, and the racing mints).

**A plan** (``landing/plans/<desc_id>.json``) is what the mint's ONE listing decided for one
description: the files whose event times overlap ``[lower, upper)`` (``read``), those that
could not be indexed (``unindexed``, read whole) and, for the late check only, the earliest
and latest times and ``first_seen`` of every other file holding earlier times that is not
judged yet (``older``): a file found on time against the commit that sealed its earliest time
is marked ``judged`` in the index by the mint that found it (:func:`judge`), once, and never
checked again, so the plan and the check cost the new files, not the history. Every write
slot reads it instead of listing the zone; a missing plan makes the slot list and read as
before (:meth:`shardsink.sources.landing.LandingSource.read_slot`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardsink.core.commits import Listing
from shardsink.core.roots import RootObjects
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Sealing
from shardsink.sources.landing.files import LandingFile, LateDataError, MalformedInputError, check_late_at, to_millis
from shardsink.sources.landing.index_store import IndexEntry, load, save
from shardsink.sources.landing.layout import PLANS_PREFIX
from shardsink.storage.base import SourceVersion
from shardsink.storage.ranged import RangedFile, SourceChangedError

log = logging.getLogger("shardsink.sources")

PLAN_FORMAT = "shardsink.landing-plan/2"


class Listed(msgspec.Struct, frozen=True, array_like=True):
    key: str
    size: int
    modified: float
    identity: str


class Older(msgspec.Struct, frozen=True, array_like=True):
    key: str
    tmin: int
    tmax: int
    first_seen: float


class FilePlan(msgspec.Struct, frozen=True, kw_only=True):
    format: str = PLAN_FORMAT
    desc_id: str
    lower: int
    upper: int
    root: str
    time_column: str
    read: list[IndexEntry]
    unindexed: list[Listed]
    older: list[Older]


@dataclass(frozen=True)
class Indexed:
    """A listing joined with the index: entries by key (listed files only), the files left
    unindexed, and the index's schemas by fingerprint."""

    entries: dict[str, IndexEntry]
    unindexed: list[LandingFile]
    schemas: dict[str, str]

    def schema(self, fingerprint: str) -> pa.Schema:
        return decode_schema(self.schemas[fingerprint])


@functools.lru_cache(maxsize=256)
def decode_schema(b64: str) -> pa.Schema:
    # Many files share a schema: decode each distinct one once.
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(b64)))


def fingerprint(schema: pa.Schema) -> tuple[str, str]:
    """``(fingerprint, base64 IPC bytes)`` of a schema (metadata dropped)."""
    b64 = base64.b64encode(schema.remove_metadata().serialize().to_pybytes()).decode()
    return hashlib.sha256(b64.encode()).hexdigest()[:16], b64


def version_of(f: LandingFile) -> SourceVersion:
    return SourceVersion(f.size, f.modified, f.identity)


def _unchanged(e: IndexEntry, f: LandingFile) -> bool:
    return e.size == f.size and (e.identity == f.identity if f.identity else e.modified == f.modified)


# --- building an entry ---------------------------------------------------------------------


def time_column_index(md: pq.FileMetaData, time_column: str) -> int | None:
    return next((i for i in range(md.num_columns) if md.schema.column(i).path == time_column), None)


def chunk_range(rg: pq.RowGroupMetaData, cols: Iterable[int]) -> tuple[int, int]:
    """The byte range holding columns ``cols`` of row group ``rg``."""
    lo, hi = None, 0
    for c in cols:
        m = rg.column(c)
        start = m.dictionary_page_offset if m.has_dictionary_page and m.dictionary_page_offset else m.data_page_offset
        start = min(start, m.data_page_offset)
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + m.total_compressed_size)
    return lo or 0, hi


def group_times(rg: pq.RowGroupMetaData, col: int, field: pa.Field) -> tuple[int, int] | None:
    """``(min, max)`` event time (ms) of a row group from its statistics; None if they cannot
    be trusted (missing, or nulls present: those must be read, and refused)."""
    st = rg.column(col).statistics
    if st is None or not st.has_min_max or st.null_count is None or st.null_count > 0:
        return None
    try:
        ms = to_millis(pa.chunked_array([pa.array([st.min, st.max], type=field.type)]), where="", name="")
    except (pa.ArrowInvalid, pa.ArrowTypeError, MalformedInputError, TypeError, ValueError):
        return None
    lo, hi = ms.to_pylist()
    return (lo, hi) if lo is not None and hi is not None else None


def _merge(acc: tuple[int, int] | None, col: pa.ChunkedArray | pa.Array, where: str, name: str
           ) -> tuple[int, int] | None:
    import pyarrow.compute as pc

    ms = to_millis(col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col]), where=where, name=name)
    if ms.null_count:
        raise MalformedInputError(f"{where}: {ms.null_count} rows have a null event time in {name!r}")
    if len(ms) == 0:
        return acc
    mm = pc.min_max(ms).as_py()
    lo, hi = mm["min"], mm["max"]
    return (lo, hi) if acc is None else (min(acc[0], lo), max(acc[1], hi))


def build_entry(blob: object, f: LandingFile, time_column: str, *, where: str) -> tuple[IndexEntry, pa.Schema]:
    """The index entry of ``f`` and its schema; MalformedInputError if it cannot be indexed."""
    fmt = f.key.lower().rsplit(".", 1)[-1]
    rf = RangedFile(blob, f.key, version_of(f))
    try:
        if fmt == "parquet":
            rows, times, schema = _parquet_facts(rf, time_column, where)
        else:
            rows, times, schema = _stream_facts(rf, fmt, time_column, where)
    except SourceChangedError as e:
        raise MalformedInputError(f"{where} changed while it was indexed: {e}") from e
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as e:
        raise MalformedInputError(f"{where} is unreadable as {fmt}: {e}") from e
    fp, _ = fingerprint(schema)
    tmin, tmax = times if times is not None else (None, None)
    return IndexEntry(f.key, f.size, f.modified, f.identity, fmt, rows, tmin, tmax, fp, f.modified), schema


def _parquet_facts(rf: RangedFile, time_column: str, where: str) -> tuple[int, tuple[int, int] | None, pa.Schema]:
    pf = pq.ParquetFile(rf, pre_buffer=False)
    md, schema = pf.metadata, pf.schema_arrow
    col = time_column_index(md, time_column)
    if col is None or time_column not in schema.names:
        raise MalformedInputError(f"{where} has no event-time column {time_column!r} (columns: {schema.names})")
    field = schema.field(time_column)
    times: tuple[int, int] | None = None
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        if rg.num_rows == 0:
            continue
        got = group_times(rg, col, field)
        if got is None:  # no usable statistics: read the event-time column's chunk of this group only
            rf.prefetch(*chunk_range(rg, [col]))
            got = _merge(None, pf.read_row_group(i, columns=[time_column])[time_column], where, time_column)
            rf.drop()
        if got is not None:
            times = got if times is None else (min(times[0], got[0]), max(times[1], got[1]))
    return md.num_rows, times, schema


def _stream_facts(rf: RangedFile, fmt: str, time_column: str, where: str
                  ) -> tuple[int, tuple[int, int] | None, pa.Schema]:
    reader = pacsv.open_csv(rf) if fmt == "csv" else pajson.open_json(rf)
    schema = reader.schema
    if time_column not in schema.names:
        raise MalformedInputError(f"{where} has no event-time column {time_column!r} (columns: {schema.names})")
    rows, times = 0, None
    for b in reader:
        rows += b.num_rows
        times = _merge(times, b.column(time_column), where, time_column)
    return rows, times, schema


# --- joining a listing with the index -----------------------------------------------------------


def store_of(shard: str | RootObjects) -> RootObjects:
    """The shard's root objects (``shard``: its URL, or the store one caller reuses for its writes)."""
    return shard if isinstance(shard, RootObjects) else RootObjects(shard)


def judge(sealing: Sealing, entries: Sequence[IndexEntry], *, root: str) -> set[str]:
    """The keys of ``entries`` (not judged yet) that are *finally* on time: their earliest time is
    sealed (below ``sealing.upper``) and they are not late against the seal of that time
    (:func:`check_late_at`). A file whose earliest time no commit has sealed yet is not judged (a
    later run judges it once its time is sealed), nor is a late one (every run that lists it
    refuses it, naming it). Reads the seals once, back to the earliest such time; none at all
    when nothing needs judging."""
    upper = sealing.upper
    due = [e for e in entries if e.tmin is not None and (upper is None or e.tmin < upper)]
    if not due:
        return set()
    seals = sealing.seals_from(min(e.tmin for e in due if e.tmin is not None))
    out = set()
    for e in due:
        assert e.tmin is not None
        try:
            check_late_at(e.tmin, e.key, e.first_seen, lower=e.tmin + 1, seals=seals, root=root)
        except LateDataError:
            continue
        out.add(e.key)
    return out


def refresh(blob: object, shard_url: str | RootObjects, *, root: str, time_column: str,
            listing: Sequence[LandingFile], write: bool = True, sealing: Sealing | None = None) -> Indexed:
    """Join ``listing`` with the index of ``shard_url``, indexing new and changed files (and,
    with ``write``, adding them to the index: :func:`shardsink.sources.landing.index_store.save`);
    see the module docstring. ``sealing``: listed entries not judged yet that :func:`judge` finds
    finally on time are marked so, in the same index write."""
    store = store_of(shard_url)
    loaded = load(store, root=root, time_column=time_column)
    schemas = dict(loaded.schemas)
    entries: dict[str, IndexEntry] = {}
    fresh: dict[str, IndexEntry] = {}
    unindexed: list[LandingFile] = []
    built = _build_new(blob, [f for f in listing if (old := loaded.entries.get(f.key)) is None
                              or not _unchanged(old, f)], root=root, time_column=time_column)
    for f in listing:
        e = loaded.entries.get(f.key)
        if e is None or not _unchanged(e, f):
            got = built[f.key]
            if isinstance(got, MalformedInputError):
                log.info("not indexed (the write job reads it whole): %s", got)
                unindexed.append(f)
                continue
            e, schema = got
            fp, b64 = fingerprint(schema)
            schemas[fp] = b64
            fresh[f.key] = e
        entries[f.key] = e
    if sealing is not None:
        for key in judge(sealing, [e for e in entries.values() if not e.judged], root=root):
            entries[key] = fresh[key] = msgspec.structs.replace(entries[key], judged=True)
    if fresh and write:
        save(store, loaded, fresh, schemas, root=root, time_column=time_column)
    return Indexed(entries, unindexed, schemas)


#: Files the mint's index refresh reads at once (each a footer read, or a whole small file: on
#: S3 one or two GETs that mostly wait): a bounded pool, so 16 new files cost about one read's wait.
INDEX_READERS = 8


def _build_new(blob: object, new: Sequence[LandingFile], *, root: str,
               time_column: str) -> dict[str, tuple[IndexEntry, pa.Schema] | MalformedInputError]:
    """:func:`build_entry` of each of ``new``, read concurrently (at most :data:`INDEX_READERS` at a
    time): key → (entry, schema), or the MalformedInputError that file got. Any other error is
    raised (the first in listing order), after every read has finished."""
    def one(f: LandingFile) -> tuple[IndexEntry, pa.Schema] | MalformedInputError:
        try:
            return build_entry(blob, f, time_column, where=f"{root}/{f.key}")
        except MalformedInputError as err:
            return err

    if len(new) < 2:
        return {f.key: one(f) for f in new}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(INDEX_READERS, len(new)), thread_name_prefix="shardsink-index") as pool:
        futures = [(f.key, pool.submit(one, f)) for f in new]
        return {key: fut.result() for key, fut in futures}


# --- plans -------------------------------------------------------------------------------------


def plan_key(desc_id: str) -> str:
    if not desc_id or "/" in desc_id or desc_id in (".", ".."):
        raise InvalidUsageError(f"description id {desc_id!r} is not one key segment", value=desc_id[:200])
    return f"{PLANS_PREFIX}{desc_id}.json"


def make_plan(indexed: Indexed, *, desc_id: str, lower: int, upper: int, root: str, time_column: str,
              listing: Sequence[LandingFile]) -> FilePlan:
    """What the write slots of ``[lower, upper)`` read (listing order), and the older files they check."""
    read, older = [], []
    for f in listing:
        e = indexed.entries.get(f.key)
        if e is None or e.tmin is None or e.tmax is None:
            continue
        if e.tmax >= lower and e.tmin < upper:
            read.append(e)
        elif e.tmin < lower and not e.judged:  # judged on time once: never checked again
            older.append(Older(e.key, e.tmin, e.tmax, e.first_seen))
    return FilePlan(desc_id=desc_id, lower=lower, upper=upper, root=root, time_column=time_column, read=read,
                       unindexed=[Listed(f.key, f.size, f.modified, f.identity) for f in indexed.unindexed],
                       older=older)


def plan_listing(plan: FilePlan, at: float) -> Listing:
    """The listing ``plan`` was made from, taken at ``at`` (the zone's clock, just before it): the
    files the plan reads that appeared at or after ``at`` are recorded as held, so the late check
    of later runs never judges them late against this listing (equal whole seconds on S3)."""
    held = {(e.key, e.first_seen) for e in plan.read if e.first_seen >= at}
    held |= {(u.key, u.modified) for u in plan.unindexed if u.modified >= at}
    return Listing(at=at, held=tuple(sorted(held)))


def put_plan(shard_url: str | RootObjects, plan: FilePlan) -> None:
    store_of(shard_url).put(plan_key(plan.desc_id), msgspec.json.encode(plan))


def get_plan(shard_url: str, *, desc_id: str, lower: int, upper: int, root: str, time_column: str
             ) -> FilePlan | None:
    """The mint's plan for this description, or None (missing, unreadable, or not this
    description's or source's: the caller lists and reads as without a plan)."""
    store = RootObjects(shard_url)
    data = store.get(plan_key(desc_id))
    if data is None:
        return None
    try:
        plan = msgspec.json.decode(data, type=FilePlan)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("%s is unreadable (%s): listing the landing zone instead", store.where(plan_key(desc_id)), e)
        return None
    if plan.format != PLAN_FORMAT or (plan.desc_id, plan.lower, plan.upper, plan.root, plan.time_column) != (
            desc_id, lower, upper, root, time_column):
        return None
    return plan
