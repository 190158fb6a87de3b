"""Merge inputs written under older schema ids, read as the newest schema (schema evolution).

Compaction merges parts of different schema ids into the newest schema: :func:`projected_inputs`
wraps the merge's part source so that every part of a batch written under another schema id
is read projected (:func:`shardsink.core.schema.project`: by field id, nulls for added
columns, casts for widened ones, renamed by id, dropped columns left out), and marks those
parts unordered for the merge. SUBTLE: a projection need not keep a part's sort order (a
dropped column between two sort keys breaks it, and rows equal once it is gone must be
summed), so projected parts go through the merge's sort (:func:`shardsink.maintenance.runs.sort_runs`)
rather than its streaming k-way path, which trusts each input to be sorted and consolidated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core import schema as sch
from shardsink.core.state import BatchMeta, Header, PartMeta, SchemaEntry
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError
from shardsink.maintenance.merge import PartSource


class _ProjectedFile:
    """A Parquet part read through a projection: the part of the ``pq.ParquetFile`` surface the
    merge uses (``metadata``, ``iter_batches``), yielding record batches of the target schema."""

    def __init__(self, f: pq.ParquetFile, source: SchemaEntry, target: SchemaEntry) -> None:
        self._f, self._source, self._target = f, source, target
        self.metadata = f.metadata

    def iter_batches(self, batch_size: int = 65536, columns: Sequence[str] | None = None,
                     **kw: Any) -> Iterator[pa.RecordBatch]:
        written = pa.schema([*sch.entry_schema(self._source), pa.field(TIME, pa.int64(), False),
                             pa.field(DIFF, pa.int64(), False)])
        for rb in self._f.iter_batches(batch_size=batch_size, columns=written.names, **kw):
            t = sch.project(pa.Table.from_batches([rb]).cast(written), self._source, self._target)
            yield from t.combine_chunks().to_batches()


@dataclass(frozen=True)
class _Source:
    inner: PartSource
    projections: Mapping[str, tuple[SchemaEntry, SchemaEntry]]

    @property
    def url(self) -> str:
        return self.inner.url

    def open_part(self, p: PartMeta) -> pq.ParquetFile:
        f = self.inner.open_part(p)
        proj = self.projections.get(p.key)
        return f if proj is None else _ProjectedFile(f, *proj)  # type: ignore[return-value]


def projected_inputs(source: PartSource, header: Header, inputs: Sequence[BatchMeta],
                     target: SchemaEntry) -> tuple[PartSource, list[PartMeta]]:
    """The part source and parts to merge ``inputs`` into the schema ``target``: parts of
    batches written under ``target`` as they are; the others projected and marked unordered.
    CorruptionError if a batch names a schema id the state does not hold."""
    entries = {e.id: e for e in sch.history(header)}
    projections: dict[str, tuple[SchemaEntry, SchemaEntry]] = {}
    parts: list[PartMeta] = []
    for b in inputs:
        src = entries.get(b.schema_id)
        if src is None:
            raise CorruptionError(f"batch {b.desc_id} of {source.url} names schema id {b.schema_id}, which the "
                                  f"state does not hold (it holds {sorted(entries)})")
        for p in b.parts:
            if src.id == target.id:
                parts.append(p)
                continue
            projections[p.key] = (src, target)
            parts.append(msgspec.structs.replace(p, order="unordered"))
    if not projections:
        return source, parts
    return _Source(source, projections), parts
