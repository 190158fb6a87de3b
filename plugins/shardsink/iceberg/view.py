"""The next Iceberg metadata of a shard's view, pure: from the previous view and the next version.

:func:`start` makes the view of one shard version from its live batches (one snapshot holding
them all: turning the view on, or rebuilding it); :func:`advance` the view of version ``n`` from
the view of ``n - 1`` and version ``n`` itself: a new manifest for each batch ``n`` added, the
manifest list reusing every earlier manifest (so the cost does not grow with the shard's
history), and a snapshot when ``n`` changed the file set (an append, a close, a correction, or a
compaction: ``overwrite``). Every version gets a metadata file (a schema change, a since advance
or a retention change updates the schemas, expires snapshots, or updates properties).

Snapshots whose shard upper is at or below the shard's ``since`` are expired (their contents
can no longer be read from the shard either); the current one is always kept. The metadata log
keeps the :data:`LOG_MAX` previous metadata files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardsink.core import schema as sc
from shardsink.core.state import BatchMeta, Header, Version
from shardsink.iceberg import layout
from shardsink.iceberg import metadata as md
from shardsink.iceberg.avro_files import ManifestRef, batch_manifest, manifest_list
from shardsink.iceberg.schema_map import DIFF_ID, iceberg_schema, name_mapping

#: How many previous metadata files the metadata log names.
LOG_MAX = 10
Writes = list[tuple[str, bytes]]


@dataclass(frozen=True)
class View:
    """The view at shard version ``seqno``: its metadata and its current snapshot's manifests."""

    seqno: int
    meta: md.TableMetadata
    refs: tuple[ManifestRef, ...]


def _properties(url: str, header: Header) -> dict[str, str]:
    return {"shardsink.shard": url, "shardsink.seqno": str(header.seqno),
            "shardsink.upper": "closed" if header.upper is None else str(header.upper),
            "shardsink.since": str(header.since),
            "shardsink.retention": "all" if header.retention is None else str(header.retention),
            "schema.name-mapping.default": name_mapping(header)}


def _summary(header: Header, operation: str, added: Sequence[ManifestRef], gone: Sequence[ManifestRef],
             refs: Sequence[ManifestRef], commit: str) -> dict[str, str]:
    return {"operation": operation, "shardsink.seqno": str(header.seqno), "shardsink.commit": commit,
            "shardsink.upper": "closed" if header.upper is None else str(header.upper),
            "shardsink.since": str(header.since),
            "added-data-files": str(sum(r.added for r in added)), "added-records": str(sum(r.rows for r in added)),
            "deleted-data-files": str(sum(r.added for r in gone)), "deleted-records": str(sum(r.rows for r in gone)),
            "total-data-files": str(sum(r.added for r in refs)), "total-records": str(sum(r.rows for r in refs)),
            "total-delete-files": "0", "total-position-deletes": "0", "total-equality-deletes": "0"}


def _manifests(url: str, header: Header, batches: Sequence[BatchMeta]) -> tuple[Writes, list[ManifestRef]]:
    writes: Writes = []
    refs = []
    for b in batches:
        entry = sc.entry(header, b.schema_id) or sc.current(header)
        data, ref = batch_manifest(url, b, iceberg_schema(entry))
        writes.append((ref.key, data))
        refs.append(ref)
    return writes, refs


def _metadata(url: str, header: Header, at_ms: int, prev: md.TableMetadata | None,
              snap: md.Snapshot | None) -> md.TableMetadata:
    """The metadata of ``header``'s version: ``prev``'s snapshots (expired by since) plus ``snap``."""
    snaps = [*(prev.snapshots if prev else ()), *([snap] if snap else [])]
    current = snap.snapshot_id if snap else prev.current_snapshot_id if prev else None
    kept = tuple(s for s in snaps if s.snapshot_id == current or (u := s.upper()) is None or u > header.since)
    ids = {s.snapshot_id for s in kept}
    log = tuple(e for e in (*(prev.snapshot_log if prev else ()),
                            *([md.SnapshotLogEntry(snap.snapshot_id, snap.timestamp_ms)] if snap else []))
                if e.snapshot_id in ids)
    mlog = () if prev is None else (
        *prev.metadata_log, md.MetadataLogEntry(layout.location(url, layout.metadata_key(header.seqno - 1)),
                                                prev.last_updated_ms))[-LOG_MAX:]
    return md.TableMetadata(
        format_version=2, table_uuid=layout.table_uuid(url), location=layout.location(url),
        last_sequence_number=max([s.sequence_number for s in kept] + [prev.last_sequence_number if prev else 0]),
        last_updated_ms=max(at_ms, prev.last_updated_ms if prev else 0), last_column_id=DIFF_ID,
        schemas=tuple(iceberg_schema(e) for e in sc.history(header)), current_schema_id=sc.current(header).id,
        properties=_properties(url, header), snapshots=kept, snapshot_log=log, metadata_log=mlog,
        refs={} if current is None else {"main": md.Ref(current)}, current_snapshot_id=current)


def _snapshot(url: str, header: Header, at_ms: int, prev: md.TableMetadata | None, refs: Sequence[ManifestRef],
              summary: dict[str, str]) -> tuple[md.Snapshot, bytes]:
    parent = prev.current_snapshot_id if prev else None
    last = max((s.timestamp_ms for s in prev.snapshots), default=0) if prev else 0
    n = header.seqno
    data = manifest_list(url, n, None if parent is None else layout.seqno_of_snapshot(parent), refs)
    snap = md.Snapshot(layout.snapshot_id(n), n, max(at_ms, last), layout.location(url, layout.list_key(n)),
                       summary, sc.current(header).id, parent)
    return snap, data


def start(url: str, header: Header, batches: Sequence[BatchMeta], at: str) -> tuple[View, Writes]:
    """The view of the version of ``header`` (live ``batches``), from nothing: one snapshot."""
    writes, refs = _manifests(url, header, batches)
    at_ms = md.millis(at)
    snap, data = _snapshot(url, header, at_ms, None, refs, _summary(header, "append", refs, (), refs, "start"))
    meta = _metadata(url, header, at_ms, None, snap)
    writes += [(layout.list_key(header.seqno), data), (layout.metadata_key(header.seqno), md.encode(meta))]
    return View(header.seqno, meta, tuple(refs)), writes


def _digest(key: str) -> str:
    return key.rsplit("-", 1)[-1].removesuffix(".avro")


def advance(url: str, view: View, v: Version) -> tuple[View, Writes]:
    """The view of version ``v`` from the view of ``v.seqno - 1``: what to write, metadata last."""
    assert v.seqno == view.seqno + 1, (view.seqno, v.seqno)
    header, at_ms = v.header, md.millis(v.commit.at)
    writes, added = _manifests(url, header, v.added)
    gone_digests = {_digest(layout.manifest_key(BatchMeta(d, 0, 0, 0, ()))) for d in v.removed}
    gone = [r for r in view.refs if _digest(r.key) in gone_digests] if v.commit.removes_batches else []
    refs = view.refs
    snap = None
    if added or gone:
        refs = (*(r for r in view.refs if r not in gone), *added)
        op = "overwrite" if gone else "append"
        snap, data = _snapshot(url, header, at_ms, view.meta, refs,
                               _summary(header, op, added, gone, refs, v.commit.kind))
        writes.append((layout.list_key(v.seqno), data))
    meta = _metadata(url, header, at_ms, view.meta, snap)
    writes.append((layout.metadata_key(v.seqno), md.encode(meta)))
    return View(v.seqno, meta, tuple(refs)), writes
