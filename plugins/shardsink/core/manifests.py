"""Staging manifests: the documents a description keeps under ``staging/<desc_id>/``.

* ``slot-<i>.json`` (:class:`ManifestDoc`, written by ``shardsink.sinks.staging``): what one
  writer slot of an ingest description staged;
* ``compaction.json`` (:class:`CompactionManifestDoc`, written by
  ``shardsink.maintenance.compact``): a compaction's inputs, so a later sweep can decide
  its fate.

Both share :class:`StagingHead` (format, kind, lower), which is all GC reads of a manifest.
Readers accept formats up to :data:`MANIFEST_FORMAT` and ignore unknown fields.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shardsink.core.documents import ENCODER, decode_doc
from shardsink.core.state import BatchMeta, PartMeta
from shardsink.errors import CorruptionError

#: Format of staging manifests: readers accept this or older and ignore unknown fields.
MANIFEST_FORMAT = 1


class StagingHead(msgspec.Struct, frozen=True, kw_only=True):
    """What every staging manifest has. Ingest slot manifests carry no ``kind`` (they were
    the only kind at first) and compaction manifests no ``lower`` (their inputs have it)."""

    format: int
    kind: str = "ingest"
    lower: int | None = None


class ManifestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """``staging/<desc_id>/slot-<i>.json``: what one writer slot staged for a description."""

    format: int
    desc_id: str
    lower: int
    upper: int
    attempt: int
    slot: int
    slots: int
    rows: int
    parts: tuple[PartMeta, ...]
    inputs: tuple[dict[str, Any], ...] = ()
    writer: str = ""
    written_at: str = ""
    #: What the append records in the commit info (:class:`shardsink.core.commits.AppendCommit`).
    props: dict[str, str] = msgspec.field(default_factory=dict)
    #: The shard's schema id (:mod:`shardsink.core.schema`) the parts were written with: that
    #: of the state version the writer read its schema from. None (absent: a manifest of a
    #: writer older than schema evolution): unknown; the append resolves it only where no
    #: schema change can have landed since the description was minted
    #: (:func:`shardsink.core.staged.staged_schema_id`), else refuses the batch.
    schema_id: int | None = None


class CompactionInput(msgspec.Struct, frozen=True, kw_only=True):
    desc_id: str
    lower: int
    upper: int | None
    seqno: int


class CompactionManifestDoc(msgspec.Struct, frozen=True, kw_only=True):
    """``staging/<compaction_id>/compaction.json``: the live batches a compaction replaces."""

    format: int
    kind: str  # always "compaction"
    compaction_id: str
    since: int
    inputs: tuple[CompactionInput, ...]

    def batches(self) -> tuple[BatchMeta, ...]:
        """The inputs as batches without parts (what fate needs to decide the compaction)."""
        return tuple(BatchMeta(b.desc_id, b.lower, b.upper, b.seqno, ()) for b in self.inputs)


def encode(doc: ManifestDoc | CompactionManifestDoc) -> bytes:
    return ENCODER.encode(doc)


def compaction_manifest(cid: str, inputs: tuple[BatchMeta, ...], since: int) -> CompactionManifestDoc:
    return CompactionManifestDoc(
        format=MANIFEST_FORMAT, kind="compaction", compaction_id=cid, since=since,
        inputs=tuple(CompactionInput(desc_id=b.desc_id, lower=b.lower, upper=b.upper, seqno=b.seqno)
                     for b in inputs),
    )


def decode_head(data: bytes, *, where: str) -> StagingHead:
    return decode_doc(data, StagingHead, what="staging manifest", where=where, newest=MANIFEST_FORMAT)


def decode_manifest(data: bytes, *, where: str) -> ManifestDoc:
    return decode_doc(data, ManifestDoc, what="manifest", where=where, newest=MANIFEST_FORMAT)


def decode_compaction(data: bytes, *, where: str) -> CompactionManifestDoc:
    doc = decode_doc(data, CompactionManifestDoc, what="compaction manifest", where=where, newest=MANIFEST_FORMAT)
    if doc.kind != "compaction":
        raise CorruptionError(f"{where}: unreadable compaction manifest (kind {doc.kind!r}, expected 'compaction')")
    return doc
