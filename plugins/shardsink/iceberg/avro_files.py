"""Iceberg manifests and manifest lists (format v2) as Avro bytes, written with fastavro.

The Avro schemas are the Iceberg spec's (field ids as pyiceberg writes them; optional fields this
view never fills are left out, as readers resolve by field id). The sync marker is derived from
the object's key, so the same version always produces the same bytes.

A manifest holds one batch's parts (status ADDED, the snapshot and sequence number of the shard
version that committed the batch), or the parts a compaction removed (``d-<seqno>``, status
DELETED, listed only by that compaction's snapshot). Data files carry ``_time``'s bounds.
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Sequence
from typing import Any

import fastavro
import msgspec

from shardsink.core.state import BatchMeta, PartMeta
from shardsink.iceberg import layout
from shardsink.iceberg.schema_map import TIME_ID, Schema

ADDED, DELETED = 1, 2


def _bounds(fid: int) -> dict[str, Any]:
    kv = {"type": "record", "name": f"k{fid + 1}_v{fid + 2}",
          "fields": [{"name": "key", "type": "int", "field-id": fid + 1},
                     {"name": "value", "type": "bytes", "field-id": fid + 2}]}
    return {"name": "lower_bounds" if fid == 125 else "upper_bounds", "field-id": fid, "default": None,
            "type": ["null", {"type": "array", "items": kv, "logicalType": "map"}]}


_ENTRY = fastavro.parse_schema({
    "type": "record", "name": "manifest_entry", "fields": [
        {"name": "status", "field-id": 0, "type": "int"},
        {"name": "snapshot_id", "field-id": 1, "type": ["null", "long"], "default": None},
        {"name": "sequence_number", "field-id": 3, "type": ["null", "long"], "default": None},
        {"name": "file_sequence_number", "field-id": 4, "type": ["null", "long"], "default": None},
        {"name": "data_file", "field-id": 2, "type": {"type": "record", "name": "r2", "fields": [
            {"name": "content", "field-id": 134, "type": "int"},
            {"name": "file_path", "field-id": 100, "type": "string"},
            {"name": "file_format", "field-id": 101, "type": "string"},
            {"name": "partition", "field-id": 102, "type": {"type": "record", "name": "r102", "fields": []}},
            {"name": "record_count", "field-id": 103, "type": "long"},
            {"name": "file_size_in_bytes", "field-id": 104, "type": "long"},
            _bounds(125), _bounds(128),
        ]}},
    ]})

_LIST = fastavro.parse_schema({
    "type": "record", "name": "manifest_file", "fields": [
        {"name": "manifest_path", "field-id": 500, "type": "string"},
        {"name": "manifest_length", "field-id": 501, "type": "long"},
        {"name": "partition_spec_id", "field-id": 502, "type": "int"},
        {"name": "content", "field-id": 517, "type": "int"},
        {"name": "sequence_number", "field-id": 515, "type": "long"},
        {"name": "min_sequence_number", "field-id": 516, "type": "long"},
        {"name": "added_snapshot_id", "field-id": 503, "type": "long"},
        {"name": "added_files_count", "field-id": 504, "type": "int"},
        {"name": "existing_files_count", "field-id": 505, "type": "int"},
        {"name": "deleted_files_count", "field-id": 506, "type": "int"},
        {"name": "added_rows_count", "field-id": 512, "type": "long"},
        {"name": "existing_rows_count", "field-id": 513, "type": "long"},
        {"name": "deleted_rows_count", "field-id": 514, "type": "long"},
    ]})


class ManifestRef(msgspec.Struct, frozen=True, array_like=True):
    """One manifest list entry: the manifest's key under the shard root and what the list says of it."""

    key: str
    length: int
    seqno: int  # the shard version that wrote it (sequence number; its snapshot added it)
    added: int  # ADDED files (a batch's manifest) ...
    deleted: int  # ... or DELETED files (a compaction's removed parts)
    rows: int


def _write(key: str, schema: Any, records: Sequence[dict[str, Any]], meta: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    sync = hashlib.sha256(key.encode()).digest()[:16]
    fastavro.writer(buf, schema, records, codec="deflate", metadata=meta, sync_marker=sync)
    return buf.getvalue()


def _entry(url: str, p: PartMeta, status: int, seqno: int) -> dict[str, Any]:
    return {"status": status, "snapshot_id": layout.snapshot_id(seqno), "sequence_number": seqno,
            "file_sequence_number": seqno, "data_file": {
                "content": 0, "file_path": layout.location(url, p.key), "file_format": "PARQUET", "partition": {},
                "record_count": p.rows, "file_size_in_bytes": p.bytes,
                "lower_bounds": [{"key": TIME_ID, "value": struct.pack("<q", p.min_time)}],
                "upper_bounds": [{"key": TIME_ID, "value": struct.pack("<q", p.max_time)}]}}


def _meta(schema: Schema) -> dict[str, str]:
    return {"schema": msgspec.json.encode(schema).decode(), "schema-id": str(schema.schema_id),
            "partition-spec": "[]", "partition-spec-id": "0", "format-version": "2", "content": "data"}


def batch_manifest(url: str, batch: BatchMeta, schema: Schema) -> tuple[bytes, ManifestRef]:
    """The manifest of ``batch``'s parts (ADDED by the shard version that committed it)."""
    key = layout.manifest_key(batch)
    data = _write(key, _ENTRY, [_entry(url, p, ADDED, batch.seqno) for p in batch.parts], _meta(schema))
    return data, ManifestRef(key, len(data), batch.seqno, len(batch.parts), 0, batch.rows)


def deletes_manifest(url: str, seqno: int, parts: Sequence[PartMeta], schema: Schema) -> tuple[bytes, ManifestRef]:
    """The manifest of the parts the compaction at ``seqno`` removed (DELETED by its snapshot)."""
    key = layout.deletes_key(seqno)
    data = _write(key, _ENTRY, [_entry(url, p, DELETED, seqno) for p in parts], _meta(schema))
    return data, ManifestRef(key, len(data), seqno, 0, len(parts), sum(p.rows for p in parts))


def manifest_list(url: str, seqno: int, parent: int | None, refs: Sequence[ManifestRef]) -> bytes:
    """The manifest list of the snapshot of shard version ``seqno``."""
    key = layout.list_key(seqno)
    meta = {"snapshot-id": str(layout.snapshot_id(seqno)), "sequence-number": str(seqno), "format-version": "2",
            "parent-snapshot-id": "null" if parent is None else str(layout.snapshot_id(parent))}
    records = [{"manifest_path": layout.location(url, r.key), "manifest_length": r.length, "partition_spec_id": 0,
                "content": 0, "sequence_number": r.seqno, "min_sequence_number": r.seqno,
                "added_snapshot_id": layout.snapshot_id(r.seqno), "added_files_count": r.added,
                "existing_files_count": 0, "deleted_files_count": r.deleted,
                "added_rows_count": r.rows if r.added else 0, "existing_rows_count": 0,
                "deleted_rows_count": r.rows if r.deleted else 0} for r in refs]
    return _write(key, _LIST, records, meta)


def read_list(url: str, data: bytes) -> tuple[ManifestRef, ...]:
    """The entries of a manifest list this view wrote (the writer's cache miss; GC's holder)."""
    prefix = layout.location(url, "")[: -len(layout.TABLE)]
    out = []
    for r in fastavro.reader(io.BytesIO(data)):
        assert isinstance(r, dict)
        deleted = int(r["deleted_files_count"])
        out.append(ManifestRef(str(r["manifest_path"])[len(prefix):], int(r["manifest_length"]),
                               int(r["sequence_number"]), int(r["added_files_count"]), deleted,
                               int(r["deleted_rows_count"] if deleted else r["added_rows_count"])))
    return tuple(out)


def read_manifest_paths(url: str, data: bytes) -> tuple[str, ...]:
    """The part keys (under the shard root) a manifest this view wrote lists."""
    prefix = layout.location(url, "")[: -len(layout.TABLE)]
    return tuple(str(r["data_file"]["file_path"])[len(prefix):]  # type: ignore[index,call-overload]
                 for r in fastavro.reader(io.BytesIO(data)))
