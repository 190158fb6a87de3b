"""Merging sorted, consolidated parts into fewer, larger ones, in bounded memory.

Every part is sorted by the user columns then ``_time`` and consolidated (core.consolidate).
:func:`merge_parts` streams a k-way merge over them: each input is read record batch by
record batch (``ParquetFile.iter_batches``), and a round emits every pooled row that is
strictly below the smallest *last loaded* row among the inputs not yet exhausted (the
"bound"). Rows of an input arrive in order, so no row still to be read sorts below the
bound: the emitted rows are final, and each group of equal ``(row, _time)`` is complete
when emitted, so it is consolidated on the spot. Then the input that set the bound loads
its next batch (so every round makes progress).

SUBTLE: strictly below, not ``<=``: advancing times to ``since`` can make consecutive
rows of ONE input equal (``(r, t1)`` and ``(r, t2)``, both below since), so the next
unread batch of an input may start with a row equal to the bound.

Inputs are opened through a :class:`PartSource` (the maintenance handle,
:meth:`shardsink.core.admin.AdminHandle.open_part`); outputs are written through the one
batch builder (:meth:`shardsink.core.builder.BatchBuilder.put_part`), which names each part.

Memory: per input, one decoded *row group* (Parquet decodes a row group at a time, however
small the record batches asked for) and its compressed bytes; plus the rows carried
between rounds (at most one batch per input) and one output part being encoded. Outputs
are written in row groups of ``row_group_rows``, so compacted parts, the large inputs of
later merges, stream in small steps. HAZARD: a part staged by an append has pyarrow's
default row groups (up to 1Mi rows, bounded by ``TARGET_PART_BYTES`` of decoded data):
merging k such parts holds up to k of those at once. Inputs whose decoded size fits
``small_bytes`` take a fast path: read whole, consolidated once (the same output).

Times below ``since`` are advanced to ``since`` as rows are read. That map is monotone,
so each input stays sorted and the merge stays valid.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import floats as fl
from shardsink.core.builder import BatchBuilder
from shardsink.core.consolidate import consolidate
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError

_MARK = "__shardsink_bound"


@dataclass(frozen=True)
class MergeOptions:
    """Knobs of one merge. ``batch_rows``: rows per record batch read from an input;
    ``part_bytes``: decoded bytes per output part; ``small_bytes``: inputs up to this
    decoded size are merged in one go."""

    batch_rows: int = 65_536
    part_bytes: int = 64 * 1024 * 1024
    small_bytes: int = 32 * 1024 * 1024
    row_group_rows: int = 65_536


@dataclass
class MergeStats:
    """What a merge did; ``peak_rows`` is the most rows it held decoded at once."""

    inputs: int = 0
    rows_in: int = 0
    rows_out: int = 0
    rounds: int = 0
    peak_rows: int = 0
    streamed: bool = False
    batches_read: int = 0
    parts: list[PartMeta] = field(default_factory=list)


class PartSource(Protocol):
    """Where merge inputs are opened (:class:`shardsink.core.admin.AdminHandle` is one)."""

    @property
    def url(self) -> str: ...

    def open_part(self, p: PartMeta) -> pq.ParquetFile:
        """``p`` as a Parquet file; CorruptionError if missing, unreadable or of another row count."""
        ...


#: Test hook: called with (input index, rows) for every record batch read from an input.
OnBatch = Callable[[int, int], None]


def _full_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([*schema, pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)])


def _advance(table: pa.Table, since: int) -> pa.Table:
    t = table.column(TIME)
    if table.num_rows == 0 or pc.min(t).as_py() >= since:
        return table
    i = table.schema.get_field_index(TIME)
    return table.set_column(i, table.schema.field(i), pc.max_element_wise(t, pa.scalar(since, pa.int64())))


class _Writer:
    """Cuts the merged, consolidated stream into parts of about ``part_bytes`` each, written
    through ``builder`` (fresh keys under the builder's prefix)."""

    def __init__(self, builder: BatchBuilder, schema: pa.Schema, options: MergeOptions, stats: MergeStats) -> None:
        self.builder, self.schema, self.stats = builder, schema, stats
        self.part_bytes, self.group_rows = options.part_bytes, max(1, options.row_group_rows)
        self._buf: io.BytesIO | None = None
        self._w: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []  # emitted rows not yet in a row group
        self._pending_rows = 0
        self._rows = self._bytes = 0
        self._tmin: int | None = None
        self._tmax: int | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table.cast(self.schema))
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.group_rows:
            self._group()

    def _group(self) -> None:
        """Write the pending rows as row groups of at most ``group_rows``."""
        if not self._pending:
            return
        if self._w is None:
            self._buf = io.BytesIO()
            self._w = pq.ParquetWriter(self._buf, self.schema)
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        self._w.write_table(table, row_group_size=self.group_rows)
        mm = pc.min_max(table.column(TIME))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        self._tmin = lo if self._tmin is None else min(self._tmin, lo)
        self._tmax = hi if self._tmax is None else max(self._tmax, hi)
        self._rows += table.num_rows
        self._bytes += table.nbytes
        if self._bytes >= self.part_bytes:
            self.flush()

    def flush(self) -> None:
        self._group()
        if self._w is None or self._buf is None:
            return
        self._w.close()
        data = self._buf.getvalue()
        assert self._tmin is not None and self._tmax is not None
        self.stats.parts.append(self.builder.put_part(data, rows=self._rows, min_time=self._tmin,
                                                      max_time=self._tmax))
        self.stats.rows_out += self._rows
        self._w, self._buf, self._rows, self._bytes, self._tmin, self._tmax = None, None, 0, 0, None, None


def _open_all(source: PartSource, parts: Sequence[PartMeta]) -> list[pq.ParquetFile]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(source.open_part, parts))


def _reader(f: pq.ParquetFile, p: PartMeta, source: PartSource, full: pa.Schema, since: int,
            batch_rows: int) -> Iterator[pa.Table]:
    try:
        for rb in f.iter_batches(batch_size=batch_rows, columns=full.names):
            yield _advance(fl.canonical_table(pa.Table.from_batches([rb]).cast(full)), since)
    except CorruptionError:
        raise
    except Exception as e:
        raise CorruptionError(f"part {source.url}/{p.key} is unreadable: {type(e).__name__}: {e}") from e


def merge_parts(source: PartSource, parts: Sequence[PartMeta], schema: pa.Schema, *, into: BatchBuilder,
                since: int, options: MergeOptions = MergeOptions(), on_batch: OnBatch | None = None) -> MergeStats:
    """Merge ``parts`` (each sorted and consolidated, opened through ``source``) into
    consolidated, sorted parts written by ``into`` (e.g. ``admin.builder(cid)``), with every
    time below ``since`` advanced to ``since``. Returns the stats; ``stats.parts`` are the
    written parts (none if everything cancelled out)."""
    full = _full_schema(schema)
    keys = [*schema.names, TIME]
    stats = MergeStats(inputs=len(parts), rows_in=sum(p.rows for p in parts))
    out = _Writer(into, full, options, stats)
    files = _open_all(source, parts)
    decoded = sum(f.metadata.row_group(i).total_byte_size for f in files for i in range(f.metadata.num_row_groups))
    if decoded <= options.small_bytes:
        tables = []
        for i, (f, p) in enumerate(zip(files, parts, strict=True)):
            for t in _reader(f, p, source, full, since, options.batch_rows):
                stats.batches_read += 1
                if on_batch is not None:
                    on_batch(i, t.num_rows)
                tables.append(t)
        data = pa.concat_tables(tables) if tables else full.empty_table()
        stats.peak_rows = data.num_rows
        out.write(consolidate(data, keys))
        out.flush()
        return stats
    stats.streamed = True
    _stream(files, parts, source, full, keys, since, options, stats, out, on_batch)
    out.flush()
    return stats


def _stream(files: list[pq.ParquetFile], parts: Sequence[PartMeta], source: PartSource, full: pa.Schema,
            keys: list[str], since: int, options: MergeOptions, stats: MergeStats, out: _Writer,
            on_batch: OnBatch | None) -> None:
    readers = [_reader(f, p, source, full, since, options.batch_rows) for f, p in zip(files, parts, strict=True)]
    last: dict[int, pa.Table] = {}  # input -> its last loaded row (1-row table), inputs not exhausted
    pool: list[pa.Table] = []

    def load(i: int) -> None:
        for t in readers[i]:
            if t.num_rows == 0:
                continue
            stats.batches_read += 1
            if on_batch is not None:
                on_batch(i, t.num_rows)
            pool.append(t)
            last[i] = t.slice(t.num_rows - 1, 1)
            return
        last.pop(i, None)

    for i in range(len(readers)):
        load(i)
    sort_keys = [(k, "ascending", "at_end") for k in keys]
    while pool:
        stats.rounds += 1
        carry = pa.concat_tables(pool)
        pool.clear()
        stats.peak_rows = max(stats.peak_rows, carry.num_rows)
        if not last:
            out.write(consolidate(carry, keys))
            return
        # The bound: the smallest last-loaded row of the inputs still being read.
        ids = list(last)
        lasts = pa.concat_tables([last[i] for i in ids])
        first = pc.sort_indices(lasts, sort_keys=sort_keys)[0].as_py()
        setter = ids[first]
        bound = lasts.slice(first, 1)
        # The bound sorts before data rows equal to it (mark 0 < 1): emit what precedes it.
        marked = pa.concat_tables([
            carry.append_column(_MARK, pa.array([1] * carry.num_rows, pa.int8())),
            bound.append_column(_MARK, pa.array([0], pa.int8())),
        ])
        order = pc.sort_indices(marked, sort_keys=[*sort_keys, (_MARK, "ascending", "at_end")])
        ordered = marked.take(order).drop_columns([_MARK])
        at = pc.index(pc.take(marked.column(_MARK), order), pa.scalar(0, pa.int8())).as_py()
        out.write(consolidate(ordered.slice(0, at), keys))
        rest = ordered.slice(at + 1)
        if rest.num_rows:
            pool.append(rest)
        load(setter)
