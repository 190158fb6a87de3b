"""Shard state as immutable values: versions, headers, batches and commit records. No I/O here.

A shard's history is a chain of **state versions** numbered by ``seqno`` (0, 1, 2, …).
Each version carries

* a small **header** (upper, since, schema, idempotency records, running stats, and a
  pointer to a rollup), whose size does not grow with the shard's history, and
* a **diff**: the batches this version added and the batch ids it removed.

The full list of live batches at version ``n`` is the batches of rollup ``r`` (a
snapshot of the batch list, ``r = header.rollup``; ``r = 0`` is the empty list) with
the diffs of versions ``r+1 .. n`` applied. Committing reads and writes headers and
diffs only, so its cost is constant in the length of the history. The records stored
inside a version (parts, batches, writers, stats, commit info) are msgspec structs; the
pure transitions between versions are in :mod:`shardsink.core.transitions`, the JSON
layout of versions and rollups in :mod:`shardsink.core.state_codec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import pyarrow as pa

from shardsink.core.commits import Commit

#: The order of a part's rows (persist's ``RunOrder``). ``"sorted"``: consolidated (at most one
#: row per distinct ``(row, _time)``, no zero diffs) and sorted by the user columns then
#: ``_time``, nulls last: the contract of every part written before orders existed.
#: ``"unordered"``: any row order, a ``(row, _time)`` may repeat, still no zero diffs (staging
#: validates them away). Readers consolidate either; compaction sorts unordered parts.
PartOrder = Literal["sorted", "unordered"]
PART_ORDERS: tuple[PartOrder, ...] = ("sorted", "unordered")
#: Where a part's multiplicities are. ``"column"``: its ``_diff`` column (every part written
#: before this field existed). ``"ones"``: the file has no ``_diff`` column and every row's diff
#: is 1 (Spark's fast ingest path writes exactly the user's rows: a constant column cost its
#: writer ~15% CPU, bench/spark_staging_floor.py). Readers open parts through
#: :func:`shardsink.core.part_io.open_part`, which supplies the ones, or plan from this field.
PartDiffs = Literal["column", "ones"]
PART_DIFFS: tuple[PartDiffs, ...] = ("column", "ones")
#: The key folder of a part :func:`correction_label` put there (parts recorded before ``corrects``).
_CORRECTION_FOLDER = re.compile(r"^parts/[^/]+/corrects-(-?\d+)_(-?\d+)/")


def correction_label(lower: int, upper: int) -> str:
    """The parts-prefix label (sub-folder) the parts correcting ``[lower, upper)`` are staged under.

    Layout only: what a part corrects is its record's ``corrects`` (:meth:`PartMeta.corrected_range`).
    The folder is still written so that shardsinks older than that field, which read it from
    the key, keep finding the corrections."""
    return f"corrects-{lower}_{upper}"


class PartMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    """One immutable Parquet object of updates, all times in ``[min_time, max_time]``.

    ``order`` (a :data:`PartOrder`): stored field, added last and left out of the JSON when
    ``"sorted"``, so parts written before it read as sorted and sorted parts encode to the
    same bytes as before. Typed ``str`` so that a reader
    tolerates an order a newer writer adds: anything but ``"sorted"`` is read as unordered
    (:attr:`is_sorted`), which is always safe (reads consolidate, compaction sorts it).

    ``diffs`` (a :data:`PartDiffs`): stored field, left out of the JSON when ``"column"``, so
    older parts read as they were written. SUBTLE: unlike ``order`` there is no safe guess
    for a value a newer writer adds, so :func:`shardsink.core.part_io.open_part` refuses one
    it does not know (CorruptionError) rather than reading diffs that may not be there; a
    shardsink older than this field reading a ``"ones"`` part fails on the missing ``_diff``
    column (CorruptionError), never reads wrong multiplicities.

    ``corrects``: stored field, left out of the JSON when None: the part holds the
    re-processing correction of the sealed range ``[corrects[0], corrects[1])``
    (:mod:`shardsink.sinks.reprocess`), its rows stamped at its batch's last time, outside that
    range. Readers ask :meth:`corrected_range`, which also reads parts recorded before the field.
    """

    key: str
    rows: int
    bytes: int
    min_time: int
    max_time: int
    order: str = "sorted"
    diffs: str = "column"
    corrects: tuple[int, int] | None = None

    @property
    def implicit_diffs(self) -> bool:
        """Whether every row of the part has diff 1 and the file holds no ``_diff`` column."""
        return self.diffs == "ones"

    @property
    def is_sorted(self) -> bool:
        """Whether the part keeps the sorted, consolidated contract (see :data:`PartOrder`)."""
        return self.order == "sorted"

    def corrected_range(self) -> tuple[int, int] | None:
        """The range ``[lo, hi)`` whose re-processing correction this part holds; None for an
        ordinary part. The one place that answers it (late-data seals, compaction plans and
        re-processing ask here).

        SUBTLE: a correction part recorded before ``corrects`` existed says so only by its key's
        :func:`correction_label` folder, which is read here for that reason alone: the key is
        read only when the field is absent, which since then means an ordinary part (whose key
        names no such folder) or such an old one."""
        if self.corrects is not None:
            return self.corrects
        m = _CORRECTION_FOLDER.match(self.key)
        return (int(m.group(1)), int(m.group(2))) if m else None


class MergedDesc(msgspec.Struct, frozen=True, array_like=True):
    """A description whose batch a compaction merged: its id, bounds and commit seqno."""

    desc_id: str
    lower: int
    upper: int | None
    seqno: int
    rows: int = 0


class BatchMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    """The parts one batch description committed, with its bounds.

    ``lineage`` (compaction outputs only): the descriptions merged into this batch, in time
    order, at most :data:`shardsink.core.transitions.LINEAGE_MAX` (the newest kept), so a fate can still answer
    "committed" for a description whose own batch was compacted away
    (:mod:`shardsink.core.fate`). None: an appended batch, or a compaction output written
    before lineage was recorded (its id then matches :data:`shardsink.core.transitions.COMPACTION_ID`). Stored field,
    left out of the JSON when None.
    """

    desc_id: str
    lower: int
    upper: int | None
    seqno: int
    parts: tuple[PartMeta, ...]
    lineage: tuple[MergedDesc, ...] | None = None
    #: The schema id (:class:`SchemaEntry`) its parts were written with: their Parquet column
    #: names map to field ids through it. Stored field, left out of the JSON when 0, so batches
    #: written before schema evolution read as written with the shard's first schema.
    schema_id: int = 0

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def order(self) -> PartOrder:
        """``"sorted"`` if every part is (an empty batch too), else ``"unordered"``: derived
        from the parts, which record their order (a batch may mix both)."""
        return "sorted" if all(p.is_sorted for p in self.parts) else "unordered"


class FieldSpec(msgspec.Struct, frozen=True):
    """One column of a schema: its stable ``id`` (never re-used), Parquet/Arrow ``name``,
    Arrow type (``str(pa.DataType)``, for humans) and nullability."""

    id: int
    name: str
    type: str
    nullable: bool


class SchemaEntry(msgspec.Struct, frozen=True):
    """One schema of a shard's history (:mod:`shardsink.core.schema`).

    ``id``: 0 for the schema the shard was created with, then 1, 2, …; ``fields``: the user
    columns with their field ids; ``arrow``: the exact Arrow schema (base64 IPC); ``seqno``,
    ``at`` and ``upper``: the version that made it current, when, and the shard's upper then
    (a read ``as_of >= upper`` sees this schema with ``schema="as_of"``).
    """

    id: int
    fields: tuple[FieldSpec, ...]
    arrow: str
    seqno: int
    at: str
    upper: int | None


class WriterRecord(msgspec.Struct, frozen=True):
    writer: str
    desc_id: str
    seqno: int
    at: str


class Stats(msgspec.Struct, frozen=True):
    batches: int = 0
    parts: int = 0
    rows: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Header:
    seqno: int
    upper: int | None  # None: closed (the empty frontier)
    since: int
    schema: pa.Schema = field(compare=False)
    rollup: int
    recent: tuple[tuple[str, int], ...]  # (desc_id or compaction id, seqno), oldest first
    writers: tuple[WriterRecord, ...]
    stats: Stats
    #: Time-travel window in ms (None: keep all history): maintenance keeps
    #: ``since <= upper - retention``. Stored field, added last (codec default None).
    retention: int | None = None
    #: The newest seqno <= this version whose diff removed batches (-1: none since the
    #: shard was created; None: unknown, a version written before this field existed),
    #: and the one before it (``prior_removal``). GC walks this chain to find every batch
    #: removed inside the retained history without reading each version. Stored fields.
    removal: int | None = None
    prior_removal: int | None = None
    #: The schema history, oldest first (:class:`SchemaEntry`); ``schema`` is the last
    #: entry's. Empty: a shard that never evolved, whose only schema is ``schema`` with id 0
    #: and field ids 1..n by position (:func:`shardsink.core.schema.history`). Stored field,
    #: left out of the JSON while empty (old versions decode to, and encode as, the same bytes).
    schemas: tuple[SchemaEntry, ...] = ()
    #: Shard options a capability above core reads (``(name, value)`` sorted by name, e.g.
    #: ``("iceberg", "on")``), set by :class:`shardsink.core.commands.OptionCommand`. Stored
    #: field, left out of the JSON while empty.
    options: tuple[tuple[str, str], ...] = ()

    def option(self, name: str) -> str | None:
        """The value of shard option ``name``; None when it is not set."""
        return dict(self.options).get(name)

    def committed_seqno(self, desc_id: str) -> int | None:
        for d, s in self.recent:
            if d == desc_id:
                return s
        return None


@dataclass(frozen=True)
class Version:
    header: Header
    added: tuple[BatchMeta, ...]
    removed: tuple[str, ...]
    commit: Commit
    #: The lowers of the ``removed`` batches, in the same order (GC's fate checks need a
    #: description's exact lower once the version that committed it is gone). Stored
    #: field, added last: () in versions written before it existed.
    removed_lowers: tuple[int, ...] = ()

    @property
    def seqno(self) -> int:
        return self.header.seqno

