"""The file schemas ``schema_mode="add_columns"``'s mint checks, from the mint's own plans.

The mint lists the landing zone once (:meth:`shardsink.sources.landing.LandingSource.prepare_chain`)
and, next to its descriptions' plans, writes the schema of every file those plans make the
write jobs read (the files whose event times overlap the chain's window, and those the index
could not hold, read whole): ``landing/plans/<first desc_id>.schemas.json`` (under the
plans' prefix, kept as long as its description may commit; :mod:`shardsink.sources.landing.layout`).
So its size, and the check's cost, are the chain's files, not the zone's history: an older
file is never read again (its rows were ingested when they were sealed, or it is refused as
late). The evolution step that follows in the same mint
(:func:`shardsink.sinks.evolve.evolve_for_source`) reads it instead of listing the zone a second
time. A missing or foreign one (a mint that crashed before writing it, another source) costs
that second listing and a join with the index over every listed file, never a wrong schema.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from shardsink.core.roots import RootObjects
from shardsink.sources.landing.files import MalformedInputError, read_file_schema
from shardsink.sources.landing.index import FilePlan, Indexed, decode_schema, plan_key, refresh, store_of

log = logging.getLogger("shardsink.sources")

SCHEMAS_FORMAT = "shardsink.landing-schemas/2"


class FileSchema(msgspec.Struct, frozen=True, array_like=True):
    """One file the chain reads: its format and schema fingerprint ("": it could not be indexed)."""

    key: str
    fmt: str
    schema: str


class ChainSchemas(msgspec.Struct, frozen=True, kw_only=True):
    format: str = SCHEMAS_FORMAT
    desc_id: str
    root: str
    time_column: str
    #: fingerprint -> base64 Arrow IPC schema (those the files use).
    schemas: dict[str, str]
    files: list[FileSchema]
    #: The lower of description ``desc_id`` (GC keeps the document while it may commit); None
    #: in documents of older mints.
    lower: int | None = None


def schemas_key(desc_id: str) -> str:
    return plan_key(desc_id).removesuffix(".json") + ".schemas.json"


def put_chain_schemas(shard_url: str | RootObjects, indexed: Indexed, *, desc_id: str, lower: int, root: str,
                      time_column: str, plans: Sequence[FilePlan]) -> None:
    """Record the schema of every file ``plans`` read (see the module docstring), in listing (key) order."""
    keys = sorted({e.key for p in plans for e in p.read} | {u.key for p in plans for u in p.unindexed})
    files = []
    for key in keys:
        e = indexed.entries.get(key)
        files.append(FileSchema(key, key.lower().rsplit(".", 1)[-1], e.schema if e is not None else ""))
    used = {f.schema for f in files if f.schema}
    doc = ChainSchemas(desc_id=desc_id, lower=lower, root=root, time_column=time_column,
                       schemas={k: v for k, v in indexed.schemas.items() if k in used}, files=files)
    store_of(shard_url).put(schemas_key(desc_id), msgspec.json.encode(doc))


def _get_chain_schemas(shard_url: str, *, desc_id: str, root: str, time_column: str) -> ChainSchemas | None:
    store = RootObjects(shard_url)
    data = store.get(schemas_key(desc_id))
    if data is None:
        return None
    try:
        doc = msgspec.json.decode(data, type=ChainSchemas)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("%s is unreadable (%s): listing the landing zone instead", store.where(schemas_key(desc_id)), e)
        return None
    if doc.format != SCHEMAS_FORMAT or (doc.desc_id, doc.root, doc.time_column) != (desc_id, root, time_column):
        return None
    return doc


def indexed_schemas(src: Any, shard_url: str, schema: pa.Schema | None, *, desc_id: str | None = None
                    ) -> Iterator[tuple[str, pa.Schema]]:
    """:meth:`shardsink.sources.landing.LandingSource.file_schemas` from the mint's plans
    (``desc_id``: the chain's first description: the files that chain reads) or, without it,
    from one listing joined with the index of ``shard_url`` (every listed file). A file whose
    columns (as pinned by ``schema``) equal an earlier file's is not yielded again: it could
    not change the target schema, nor fail first."""
    doc = _get_chain_schemas(shard_url, desc_id=desc_id, root=src.root, time_column=src.time_column) \
        if desc_id is not None else None
    if doc is not None:
        files, schemas = [(f.key, f.fmt, f.schema) for f in doc.files], doc.schemas
    else:
        listing = src.files()
        # Read-only: the mint indexed the zone just before (prepare_chain); a check that refuses
        # must leave the shard as it was, and one that passes has nothing new to record.
        idx = refresh(src.blob(), shard_url, root=src.root, time_column=src.time_column, listing=listing,
                      write=False)
        schemas = idx.schemas
        files = [(f.key, f.key.lower().rsplit(".", 1)[-1], e.schema if (e := idx.entries.get(f.key)) else "")
                 for f in listing]
    blob, seen = None, set()
    for key, fmt, fp in files:
        where = f"{src.root}/{key}"
        fs = _pinned(decode_schema(schemas[fp]), fmt, schema) if fp and fp in schemas else None
        if fs is not None:
            same = fs.serialize().to_pybytes()
            if same in seen:
                continue
            seen.add(same)
        else:
            blob = blob or src.blob()  # only for a file the index cannot answer for
            fs = read_file_schema(blob, key, schema, where=where)
        if src.time_column not in fs.names:
            raise MalformedInputError(f"{where} has no event-time column {src.time_column!r} (columns: {fs.names})")
        yield where, fs.remove(fs.get_field_index(src.time_column))


def _pinned(inferred: pa.Schema, fmt: str, schema: pa.Schema | None) -> pa.Schema | None:
    """The schema a pinned read of a CSV / JSONL file gives (``schema``'s types for the columns
    it names), from the types inferred when it was indexed; None when they differ (a pinned
    read may fail: the caller reads the file). A Parquet file's schema is its footer's."""
    if fmt == "parquet" or schema is None:
        return inferred
    pins = {c.name: c.type for c in schema}
    for c in inferred:
        if c.name in pins and c.type != pins[c.name] and not pa.types.is_null(c.type):
            return None
    if fmt == "csv":
        return pa.schema([pa.field(c.name, pins.get(c.name, c.type)) for c in inferred])
    # JSONL read with an explicit schema: its columns first (absent ones as nulls), then the rest.
    return pa.schema([*(pa.field(c.name, c.type) for c in schema),
                      *(c for c in inferred if c.name not in pins)])
