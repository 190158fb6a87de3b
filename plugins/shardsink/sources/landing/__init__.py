"""The landing-zone source: Parquet / CSV / JSONL files under a folder or S3 prefix.

Convention (docs/landing-zone.md): data files ``*.parquet``, ``*.csv``, ``*.jsonl``
anywhere under ``root``, each with an event-time column (int64 ms since the epoch, or
a timestamp); ``root/_watermark.json`` = ``{"watermark": <ms>}`` published by the
producer once every file with event times below it has landed. Names starting with
``_`` or ``.`` are not data.

Files are assigned to writer slots by a stable hash of their key, and read on the
executors with pyarrow through the shardsink storage layer (local folder or S3 via
boto3), so no hadoop-aws jars are needed. A declared day-folder layout (``partitions=``,
``lateness=``) bounds what a run lists (:mod:`shardsink.sources.landing.partitions`).

The parts, each importing only those before it: one file at a time (reading, shaping rows,
the late check: :mod:`.files`, whose names this module re-exports), the layout
(:mod:`.partitions`), the landed-file index as stored (:mod:`.index_store`),
the index's entries and the mint's plans (:mod:`.index`), reading a plan in bounded
memory (:mod:`.read`), the ``add_columns`` schemas (:mod:`.schemas`), and
this source, which ties them together.

SUBTLE (late data): a file may hold times below the description's lower. That is fine
when the listing that sealed those times held it (its rows were ingested then and are
filtered out now), or when no commit has sealed them yet (their own run reads them). A file
that appeared at or after the listing that sealed its earliest time, and that listing does
not hold, broke the watermark contract; its rows can never be ingested exactly once, so the
job refuses it, naming the file, its earliest time and the sealing commit. Both times come
from the landing store's clock (the file's modification time, and the clock read just before
the mint's listing: :meth:`LandingSource.prepare_chain`), so no two hosts' clocks are compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.commits import Listing
from shardsink.core.roots import RootObjects
from shardsink.core.state_codec import schema_from_json, schema_to_json
from shardsink.core.updates import TIME, user_schema
from shardsink.errors import InvalidUsageError
from shardsink.sources.base import Seal, Sealing, map_on_executors, spread_rows
from shardsink.sources.evolution import SchemaMode
from shardsink.sources.landing.files import (
    LandingFile,
    LateDataError,
    MalformedInputError,
    check_late,
    check_late_at,
    file_of,
    parse_columns,
    read_data_file,
    read_file_schema,
    read_landing_file,
    shape_rows,
    slot_of,
)
from shardsink.sources.landing.index import (
    get_plan,
    make_plan,
    plan_key,
    plan_listing,
    put_plan,
    refresh,
)
from shardsink.sources.landing.partitions import check_in_day, check_layout, day_prefixes, day_span, in_span
from shardsink.sources.landing.read import read_planned
from shardsink.sources.landing.schemas import indexed_schemas, put_chain_schemas
from shardsink.specs import LandingSpec, spec_as, spec_to_builtins
from shardsink.storage.base import Blob
from shardsink.storage.url import ShardUrl, open_blob, parse_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WATERMARK_KEY = "_watermark.json"
SUFFIXES = (".parquet", ".csv", ".jsonl")

__all__ = [
    "SUFFIXES", "WATERMARK_KEY", "LandingFile", "LandingSource", "LateDataError", "MalformedInputError",
    "PlanMissingError",
    "check_late", "check_late_at", "parse_columns", "read_data_file", "read_file_schema", "read_landing_file",
    "shape_rows", "slot_of",
]


class PlanMissingError(InvalidUsageError):
    """A description minted with a file plan has none to read (deleted, or its mint crashed
    before writing it): its input cannot be known, so it is not staged."""


class LandingSource:
    """Files under ``root`` (a path, ``file://`` or ``s3://`` URL) with an event-time column."""

    kind = "landing"
    spec_type = LandingSpec

    def __init__(self, root: str, *, time_column: str = "event_time", schema: pa.Schema | None = None,
                 partitions: str | None = None, lateness: str | None = None) -> None:
        self.url: ShardUrl = parse_url(root)
        self.root = str(self.url)
        self.time_column = time_column
        self._schema = schema
        #: The declared day-folder layout and its lateness horizon in ms (:mod:`.partitions`).
        self.partitions, self.lateness_ms = check_layout(partitions, lateness)
        self._lateness = lateness

    # --- spec -----------------------------------------------------------------------

    def typed_spec(self) -> LandingSpec:
        """The spec as data (:mod:`shardsink.specs`)."""
        schema = schema_to_json(self._schema) if self._schema is not None else None
        return LandingSpec(root=self.root, time_column=self.time_column, schema=schema, partitions=self.partitions,
                           lateness=self._lateness)

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
        return cls(s.root, time_column=s.time_column, schema=schema, partitions=s.partitions, lateness=s.lateness)

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

    def files(self, *, window: tuple[int, int] | None = None, blob: Blob | None = None) -> list[LandingFile]:
        """Every data file under the root, sorted by key. With a declared layout, only files in day
        folders; with ``window`` too (a run's ``[lower, upper)``), only those of the folders
        that run lists (:func:`shardsink.sources.landing.partitions.day_prefixes`). ``blob``: the
        root's store, when the caller has one open."""
        blob, layout = blob or self.blob(), self.partitions
        span = day_span(self.lateness_ms, *window) if layout and window else None
        prefixes = day_prefixes(layout, span) if layout and span else None
        listed = (o for p in prefixes for o in blob.list(p)) if prefixes is not None else blob.list("")
        out = []
        for o in listed:
            name = o.key.rsplit("/", 1)[-1]
            if name.startswith(("_", ".")) or not name.lower().endswith(SUFFIXES):
                continue
            if layout and not in_span(layout, o.key, span):
                continue  # not data under the declared layout, or a day the window does not reach
            out.append(file_of(o))
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

    def prepare_chain(self, shard_url: str, descs: Sequence[Any], *, sealing: Sealing | None = None
                      ) -> list[Listing]:
        """The mint's step (:func:`shardsink.sinks.ingest.mint_chain`): list the zone ONCE (with a
        declared layout, the chain's day folders only), bring the shard's landed-file index up to
        date (new and changed files only), write each description's file plan for its write slots
        (:mod:`shardsink.sources.landing.index`) and the schemas of the files those plans read,
        for the ``add_columns`` check (:mod:`shardsink.sources.landing.schemas`). ``sealing``: what
        the shard had sealed (:class:`~shardsink.sources.landing.index.Sealing`): listed files found
        finally on time against it are marked judged in the index
        (:func:`shardsink.sources.landing.index.judge`) and leave every later plan's late check.

        Returns each description's :class:`~shardsink.core.commits.Listing`: the zone's clock
        read just before the listing, and the files its plan holds that appeared at or after it.
        The description carries it to its commit, which seals its times as of this listing
        (SUBTLE: a file landing after the listing is in no plan, so it must be judged late
        against this time, not the later commit's)."""
        if not descs:
            return []
        blob, store = self.blob(), RootObjects(shard_url)  # one client each for the whole step
        at = blob.clock()  # before the listing: every file that appeared before it is listed
        listing = self.files(window=(descs[0].lower, descs[-1].upper), blob=blob)
        indexed = refresh(blob, store, root=self.root, time_column=self.time_column, listing=listing,
                          sealing=sealing)
        plans = [make_plan(indexed, desc_id=d.desc_id, lower=d.lower, upper=d.upper, root=self.root,
                           time_column=self.time_column, listing=listing) for d in descs]
        for p in plans:
            put_plan(store, p)
        put_chain_schemas(store, indexed, desc_id=descs[0].desc_id, lower=descs[0].lower, root=self.root,
                          time_column=self.time_column, plans=plans)
        return [plan_listing(p, at) for p in plans]

    def file_schemas(self, schema: pa.Schema | None = None, *, shard_url: str | None = None,
                     desc_id: str | None = None) -> Iterator[tuple[str, pa.Schema]]:
        """``(where, user columns)`` of every data file the write jobs read (all of them, by key;
        with a declared layout, those in day folders), the event-time column left out;
        ``schema`` pins the types of the columns it names in CSV / JSONL files. Without
        ``shard_url`` reads each file (a Parquet file's footer is parsed, not its rows); with
        it, schemas come from that shard's landed-file index, and only files it does not hold
        yet are read (footers; a CSV / JSONL file once, streaming), as is a CSV / JSONL file
        whose pinned columns were inferred as other types (read pinned, as without an index).
        ``desc_id`` (the first description of the chain the mint just prepared): only the files
        that chain's plans read (those overlapping its window, and the unindexed ones), recorded
        by that mint with their schemas, so the zone is not listed again and the cost does not
        grow with history (:mod:`shardsink.sources.landing.schemas`). MalformedInputError names
        a file that cannot be read."""
        if shard_url is not None:
            yield from indexed_schemas(self, shard_url, schema, desc_id=desc_id)
            return
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
        shard_url: str | None = None,
        desc_id: str | None = None,
        listed: bool = False,
    ) -> tuple[DataFrame, list[dict[str, Any]]]:
        """The slot's rows in ``[lower, upper)`` (see :class:`shardsink.sources.base.Source`);
        ``schema_mode``: how files are read onto ``schema`` (:mod:`shardsink.sources.evolution`).
        ``shard_url`` and ``desc_id``: the description's plan, made by the mint
        (:meth:`prepare_chain`), is read from that shard: only the files the description needs
        are read, in bounded memory (:mod:`shardsink.sources.landing.read`). Without them, the
        slot lists the zone and reads each of its files whole (a description minted without a
        plan). ``listed``: the description was minted with a plan (it carries its listing): a
        missing plan is then an error naming it, never a second listing, whose file set could
        differ from the one the description seals (GC keeps a plan while its description may
        commit, so this means it was deleted by hand or the mint crashed before writing it)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        out_schema = pa.schema([*schema, pa.field(TIME, pa.int64())])
        spark_schema = from_arrow_schema(out_schema)
        if shard_url is not None and desc_id is not None:
            plan = get_plan(shard_url, desc_id=desc_id, lower=lower, upper=upper, root=self.root,
                            time_column=self.time_column)
            if plan is not None:
                return read_planned(spark, plan, slot=slot, slots=slots, schema=schema, seals=seals,
                                    schema_mode=schema_mode, spark_schema=spark_schema, partitions=self.partitions)
            if listed:
                raise PlanMissingError(
                    f"description {desc_id} [{lower}, {upper}) has no readable file plan at "
                    f"{shard_url}/{plan_key(desc_id)}: its mint's listing is what it must read, so it is not listed "
                    "again; nothing was staged. Clear the whole DAG run so a fresh mint lists the zone.",
                    value=desc_id)
        mine = [f for f in self.files(window=(lower, upper)) if slot_of(f.key, slots) == slot]
        listing = [{"key": f.key, "size": f.size, "modified": f.modified} for f in mine]
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
                    if src.partitions and t.num_rows:
                        mm = pc.min_max(t[TIME]).as_py()
                        check_in_day(src.partitions, f.key, mm["min"], mm["max"], root=src.root)
                    keep = pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper))
                    yield from t.filter(keep).to_batches()

        files_df = spread_rows(spark, [(f.key, f.size, f.modified) for f in mine],
                               "key string, size long, modified double")
        return map_on_executors(files_df, read, spark_schema), listing
