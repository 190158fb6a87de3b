"""File arrivals: Parquet / CSV / JSONL files under a folder or S3 prefix, reclocked.

No watermark and no trusted event time: a file's offset is the order in which it was
first bound (its ordinal), and its rows get the shard time of the binding that bound it
(:mod:`shardsink.reclock.bindings`). Files are read as the landing source reads them
(:func:`shardsink.sources.landing.read_data_file`); names starting with ``_`` or ``.``
are not data.

Binding (on mint): list the root; every data file not bound yet whose last-modified
time is at least ``settle_seconds`` old gets the next ordinals (ordered by modification
time, then key), and the remap shard records each bound file's key, size and identity
(:class:`shardsink.storage.base.SourceObject`). Where the listing gives no identity (a
local folder: it is the content's hash) the binding reads the file once for it, on the
driver; size and identity then come from that one read.

SUBTLE (a listing racing uploads): a file that appears after the listing, or is younger
than the settle delay, is simply not bound now; the next binding takes it. Because the
remap shard records *what* was bound (not a time cut-off), no file is ever skipped,
and because a binding is a compare-and-append on the remap shard, two racing mints
cannot bind the same file twice (the loser re-reads and uses the winner's binding).
The settle delay only protects against reading a file that is still being written in
place (a local folder); a file whose size or identity changed after it was bound is
refused, and accepted again once its exact bytes are restored.
A file deleted after binding is refused on read (MalformedInputError), never skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardsink.core.state_codec import schema_from_json, schema_to_json
from shardsink.core.updates import TIME, user_schema
from shardsink.errors import InvalidUsageError
from shardsink.reclock import health
from shardsink.reclock.bindings import FILES, Bindings, BoundFile, split
from shardsink.reclock.remap import Proposal
from shardsink.reclock.source import ReclockedBase, Routing
from shardsink.sources.base import Seal, map_on_executors, spread_rows
from shardsink.sources.evolution import SchemaMode
from shardsink.sources.landing import LandingFile, LandingSource, parse_columns, read_data_file, read_file_schema
from shardsink.sources.stamp import stamp
from shardsink.specs import FilesSpec, spec_as, spec_to_builtins
from shardsink.storage.base import check_source_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class FileArrivals(ReclockedBase):
    """Files arriving under ``root``, bound to shard times through the remap shard at ``remap``.

    ``columns`` (``{"name": "int64", ...}``) or ``schema`` declares the user columns
    (else the first file's columns are used to create the shard). ``clock`` is a test
    hook (epoch seconds); production uses the wall clock.
    """

    kind = "files"
    spec_type = FilesSpec

    def __init__(self, root: str, *, remap: str, settle_seconds: float = 30.0, schema: pa.Schema | None = None,
                 columns: Mapping[str, str] | None = None, routing: Routing | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(remap=remap, routing=routing or Routing())
        if settle_seconds < 0:
            raise InvalidUsageError(f"settle_seconds {settle_seconds} must be >= 0")
        self.landing = LandingSource(root)
        self.root = self.landing.root
        under = self.root.rstrip("/") + "/"
        inside = [u for u in (self.remap_url, *self.routing.shard_urls(None)) if u.startswith(under)]
        if inside:
            raise InvalidUsageError(
                f"shards {inside} are inside the arrivals folder {self.root}: their parts would be bound as arrivals; "
                "put the remap and data shards next to it, not under it")
        self.settle_seconds = settle_seconds
        self._schema = schema if schema is not None else (parse_columns(columns) if columns else None)
        self.clock = clock

    def typed_spec(self) -> FilesSpec:
        """The spec as data (:mod:`shardsink.specs`)."""
        r = self.routing.spec()
        return FilesSpec(root=self.root, remap=self.remap_url, settle_seconds=self.settle_seconds,
                         schema=schema_to_json(self._schema) if self._schema is not None else None,
                         outputs=r.get("outputs"), route_by=r.get("route_by"), output=r.get("output"))

    def spec(self) -> dict[str, Any]:
        """The spec's dict layout (what DAG settings and executors carry)."""
        return spec_to_builtins(self.typed_spec())

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | FilesSpec) -> FileArrivals:
        s = spec_as(spec, FilesSpec)
        return cls(s.root, remap=s.remap, settle_seconds=s.settle_seconds,
                   schema=schema_from_json(s.schema) if s.schema is not None else None, columns=s.columns,
                   routing=Routing(dict(s.outputs or {}), s.route_by, s.output))

    def for_output(self, output: str) -> FileArrivals:
        """The same source for the DAG writing output ``output`` (see ``Routing``)."""
        r = self.routing
        return FileArrivals(self.root, remap=self.remap_url, settle_seconds=self.settle_seconds, schema=self._schema,
                            routing=Routing(r.outputs, r.route_by, output), clock=self.clock)

    def schema(self) -> pa.Schema | None:
        if self._schema is not None:
            return self._schema
        files = self.landing.files()
        if not files:
            return None
        f = files[0]
        return user_schema(read_data_file(self.landing.blob(), f.key, None, where=f"{self.root}/{f.key}").schema)

    # --- binding (driver, in mint) --------------------------------------------------------

    def propose(self, bindings: Bindings) -> Proposal:
        """Bind every settled, unbound data file, recording its key, size and identity.

        A key no store can hold under the root (:func:`check_source_key`) is never bound:
        it would fail every write of its description for good. It is reported in the
        source's health instead, and the other files go on.
        """
        bound = bindings.bound_keys()
        n = bindings.latest().get(FILES, 0)
        cutoff = self.clock() - self.settle_seconds
        new, unreadable = [], []
        for f in self.landing.files():
            if f.key in bound or f.modified > cutoff:
                continue
            try:
                check_source_key(f.key)
            except InvalidUsageError as e:
                unreadable.append(str(e))
                continue
            new.append(f)
        if unreadable:
            health.record_failure(self.remap_url, f"{len(unreadable)} landed files are never bound: "
                                  + "; ".join(unreadable[:5]))
        new.sort(key=lambda f: (f.modified, f.key))
        files = tuple(BoundFile(n + i, key, size, identity)
                      for i, (key, size, identity) in enumerate(self._pinned(new)))
        return Proposal({FILES: n + len(files)} if (n or files) else {}, files)

    def _pinned(self, listed: Sequence[LandingFile]) -> list[tuple[str, int, str]]:
        """``(key, size, identity)`` to bind each listed file with, in order: the listing's, or
        (no identity listed) one read's. A file that vanished since the listing is left out
        (not bound now; if it lands again, a later binding takes it)."""
        blob = self.landing.blob() if any(not f.identity for f in listed) else None
        out = []
        for f in listed:
            if blob is None or f.identity:
                out.append((f.key, f.size, f.identity))
                continue
            got = blob.get_source(f.key)
            if got is not None:
                out.append((f.key, len(got.data), got.identity))
        return out

    # --- reading (write job) --------------------------------------------------------------

    def file_schemas(self, schema: pa.Schema | None = None) -> Iterator[tuple[str, pa.Schema]]:
        """``(where, user columns)`` of every data file under the root, bound or not (a superset of
        what the write jobs read; see :meth:`LandingSource.file_schemas`)."""
        blob = self.landing.blob()
        for f in self.landing.files():
            where = f"{self.root}/{f.key}"
            yield where, read_file_schema(blob, f.key, schema, where=where)

    def read_slot(self, spark: SparkSession, *, lower: int, upper: int, slot: int, slots: int, schema: pa.Schema,
                  seals: Sequence[Seal] = (), schema_mode: SchemaMode = "strict"
                  ) -> tuple[DataFrame, list[dict[str, Any]]]:
        """The files first bound at times in ``[lower, upper)`` dealt to this slot, stamped.

        Every row of a file bound at time ``t`` gets ``_time = t``; ``seals`` are not
        needed (bindings are final, so there is no late data). ``schema_mode``: how files are
        read onto ``schema`` (:mod:`shardsink.sources.evolution`).
        """
        from pyspark.sql.pandas.types import from_arrow_schema

        bound = self.bound_input(lower, upper)
        mine = [(bound.files[o], s.time) for s in split(bound.spans, slot=slot, slots=slots, chunk=1)
                for o in range(s.start, s.end)]
        listing = [{"ordinal": f.ordinal, "key": f.key, "size": f.size, "time": t} for f, t in mine]
        spark_schema = from_arrow_schema(pa.schema([*schema, pa.field(TIME, pa.int64())]))
        if not mine:
            return spark.createDataFrame([], spark_schema), listing
        spec, schema_bytes = self.spec(), schema.serialize().to_pybytes()

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            src = FileArrivals.from_spec(spec)
            blob = src.landing.blob()
            user = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
            for batch in batches:
                for row in batch.to_pylist():
                    where = f"{src.root}/{row['key']}"
                    t = read_data_file(blob, row["key"], user, where=where, size=row["size"], identity=row["identity"])
                    t = src.routing.select(t, where=where)
                    yield from stamp(t, user, row["time"], where=where, schema_mode=schema_mode).to_batches()

        rows = [(f.key, f.size, f.identity, t) for f, t in mine]
        df = spread_rows(spark, rows, "key string, size long, identity string, time long")
        return map_on_executors(df, read, spark_schema), listing
