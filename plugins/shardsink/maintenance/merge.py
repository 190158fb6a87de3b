"""Merging parts into fewer, larger, sorted and consolidated ones, in bounded memory.

A sorted part is sorted by the user columns then ``_time`` and consolidated (core.consolidate).
:func:`merge_parts` streams a k-way merge over them: each input is read record batch by
record batch (``ParquetFile.iter_batches``), and a round emits every loaded row that is
strictly below the smallest *last loaded* row among the inputs not yet exhausted (the
"bound"). Rows of an input arrive in order, so no row still to be read sorts below the
bound: the emitted rows are final, and each group of equal ``(row, _time)`` is complete
when emitted, so it is consolidated on the spot. Then the input that set the bound loads
its next batch (so every round makes progress). Each input's loaded rows stay sorted, so
the rows below the bound are a prefix found by binary search (comparing rows as Python
values in the sort's order, :func:`shardsink.maintenance.runs.row_key`), and only those
are sorted together: every row is sorted once.

Unordered parts (the fast ingest path, :data:`shardsink.core.state.PartOrder`) are first
sorted into sorted runs in chunks of a memory budget, spilled to temporary Parquet files
past the first (:mod:`shardsink.maintenance.runs`: an external sort's first phase); the
k-way merge then reads those runs beside the sorted parts. ``MergeOptions.memory_budget``
bounds that phase; the merge itself holds one batch per input, as before.

SUBTLE: strictly below, not ``<=``: advancing times to ``since`` can make consecutive
rows of ONE input equal (``(r, t1)`` and ``(r, t2)``, both below since), so the next
unread batch of an input may start with a row equal to the bound.

Inputs are opened through a :class:`PartSource` (the maintenance handle,
:meth:`shardsink.core.admin.AdminHandle.open_part`); outputs are written through the one
batch builder (a :class:`PartSink`: :meth:`shardsink.core.admin.AdminHandle.builder`), which names each part.

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
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core.consolidate import consolidate
from shardsink.core.part_io import FieldIds, schema_with_field_ids
from shardsink.core.state import PartMeta
from shardsink.core.updates import TIME
from shardsink.maintenance.runs import (
    SORT_FACTOR,
    RowKey,
    RunInput,
    RunOptions,
    RunStats,
    full_schema,
    part_batches,
    row_key,
    rows_below,
    sort_runs,
)


@dataclass(frozen=True)
class MergeOptions:
    """Knobs of one merge. ``batch_rows``: rows per record batch read from an input;
    ``part_bytes``: decoded bytes per output part; ``small_bytes``: inputs up to this
    decoded size are merged in one go; ``memory_budget``: decoded bytes the sorting of
    unordered inputs may hold (chunks of ``memory_budget / SORT_FACTOR`` are sorted, and
    spilled past the first, under ``spill_dir``: None is the system's temporary folder)."""

    batch_rows: int = 65_536
    part_bytes: int = 64 * 1024 * 1024
    small_bytes: int = 32 * 1024 * 1024
    row_group_rows: int = 65_536
    memory_budget: int = 512 * 1024 * 1024
    spill_dir: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int) or self.memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive int (bytes), got {self.memory_budget!r}")


@dataclass
class MergeStats:
    """What a merge did; ``peak_rows`` is the most rows it held decoded at once; ``runs``:
    sorted runs made of unordered inputs, ``spilled`` of them written to temporary files
    (``spill_bytes`` in all)."""

    inputs: int = 0
    rows_in: int = 0
    rows_out: int = 0
    rounds: int = 0
    peak_rows: int = 0
    streamed: bool = False
    batches_read: int = 0
    parts: list[PartMeta] = field(default_factory=list)
    runs: int = 0
    spilled: int = 0
    spill_bytes: int = 0


class PartSource(Protocol):
    """Where merge inputs are opened (:class:`shardsink.core.admin.AdminHandle` is one)."""

    @property
    def url(self) -> str: ...

    def open_part(self, p: PartMeta) -> pq.ParquetFile:
        """``p`` as a Parquet file; CorruptionError if missing, unreadable or of another row count."""
        ...


class PartSink(Protocol):
    """Where merge outputs are written: the batch builder of the compaction
    (:meth:`shardsink.core.admin.AdminHandle.builder`), which names each part."""

    def put_part(self, data: bytes, *, rows: int, min_time: int, max_time: int) -> PartMeta:
        """Upload one encoded Parquet part (consolidated and sorted) under a fresh key."""
        ...


#: Test hook: called with (input index, rows) for every record batch read from an input.
OnBatch = Callable[[int, int], None]


class _Writer:
    """Cuts the merged, consolidated stream into parts of about ``part_bytes`` each, written
    through ``builder`` (fresh keys under the builder's prefix)."""

    def __init__(self, builder: PartSink, schema: pa.Schema, options: MergeOptions, stats: MergeStats) -> None:
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


def _counted(i: int, tables: Iterator[pa.Table], stats: MergeStats, on_batch: OnBatch | None) -> Iterator[pa.Table]:
    """Input ``i``'s batches, counted in ``stats`` and reported to the test hook."""
    for t in tables:
        stats.batches_read += 1
        if on_batch is not None:
            on_batch(i, t.num_rows)
        yield t


def merge_parts(source: PartSource, parts: Sequence[PartMeta], schema: pa.Schema, *, into: PartSink,
                since: int, options: MergeOptions = MergeOptions(), on_batch: OnBatch | None = None,
                field_ids: FieldIds = ()) -> MergeStats:
    """Merge ``parts`` (opened through ``source``; sorted or unordered, see
    :attr:`~shardsink.core.state.PartMeta.order`) into consolidated, sorted parts written by
    ``into`` (e.g. ``admin.builder(cid)``), with every time below ``since`` advanced to
    ``since``. Returns the stats; ``stats.parts`` are the written parts (none if everything
    cancelled out). ``field_ids``: the Parquet field ids the output parts carry."""
    full = full_schema(schema)
    keys = [*schema.names, TIME]
    stats = MergeStats(inputs=len(parts), rows_in=sum(p.rows for p in parts))
    out = _Writer(into, schema_with_field_ids(full, field_ids), options, stats)
    if not all(p.is_sorted for p in parts):
        _merge_unordered(source, parts, full, keys, since, options, stats, out, on_batch)
        out.flush()
        return stats
    files = _open_all(source, parts)
    readers = [_counted(i, part_batches(f, p, source.url, full, since, options.batch_rows), stats, on_batch)
               for i, (f, p) in enumerate(zip(files, parts, strict=True))]
    if _decoded(files) <= options.small_bytes:
        tables = [t for r in readers for t in r]
        data = pa.concat_tables(tables) if tables else full.empty_table()
        stats.peak_rows = data.num_rows
        out.write(consolidate(data, keys, where=f"compaction of {source.url}"))
        out.flush()
        return stats
    stats.streamed = True
    _stream(readers, keys, stats, out, where=f"compaction of {source.url}")
    out.flush()
    return stats


def _decoded(files: Sequence[pq.ParquetFile]) -> int:
    return sum(f.metadata.row_group(i).total_byte_size for f in files for i in range(f.metadata.num_row_groups))


def _merge_unordered(source: PartSource, parts: Sequence[PartMeta], full: pa.Schema, keys: list[str], since: int,
                     options: MergeOptions, stats: MergeStats, out: _Writer, on_batch: OnBatch | None) -> None:
    """Merge inputs of which some are unordered: sort those into runs (spilled past the memory
    budget, :func:`shardsink.maintenance.runs.sort_runs`), then stream the k-way merge over the
    runs and the sorted parts. Sorted parts that fit ``small_bytes`` join the sort instead
    (one sort of a small input, as the one-shot path does)."""
    ordered = [(i, p) for i, p in enumerate(parts) if p.is_sorted]
    files = _open_all(source, [p for _, p in ordered])
    small = _decoded(files) <= options.small_bytes
    to_sort: list[RunInput] = [(i, p, _opener(source, p)) for i, p in enumerate(parts) if not p.is_sorted]
    if small:
        to_sort += [(i, p, _opened(f)) for (i, p), f in zip(ordered, files, strict=True)]
    run_stats = RunStats()

    def on_read(i: int, rows: int) -> None:
        stats.batches_read += 1
        if on_batch is not None:
            on_batch(i, rows)

    with tempfile.TemporaryDirectory(prefix="shardsink-merge-", dir=options.spill_dir) as tmp:
        runs = sort_runs(sorted(to_sort, key=lambda x: x[0]), source.url, full, keys, since,
                         options=RunOptions(chunk_bytes=max(1, options.memory_budget // SORT_FACTOR),
                                            batch_rows=options.batch_rows, row_group_rows=options.row_group_rows,
                                            spill_dir=tmp),
                         stats=run_stats, on_read=on_read)
        stats.runs, stats.spilled, stats.spill_bytes = run_stats.runs, run_stats.spilled, run_stats.spill_bytes
        stats.peak_rows = max(stats.peak_rows, run_stats.peak_rows)
        streams = [] if small else [
            _counted(i, part_batches(f, p, source.url, full, since, options.batch_rows), stats, on_batch)
            for (i, p), f in zip(ordered, files, strict=True)]
        del files
        if not streams and len(runs) == 1 and runs[0].exact:  # one sorted, consolidated run: as it is
            for t in runs[0].batches(full, options.batch_rows):
                out.write(t)
        elif streams or runs:
            stats.streamed = True
            _stream([*streams, *(r.batches(full, options.batch_rows) for r in runs)], keys, stats, out,
                    where=f"compaction of {source.url}")
        out.flush()  # before the spill files go


def _opener(source: PartSource, p: PartMeta) -> Callable[[], pq.ParquetFile]:
    return lambda: source.open_part(p)


def _opened(f: pq.ParquetFile) -> Callable[[], pq.ParquetFile]:
    return lambda: f


def _stream(readers: list[Iterator[pa.Table]], keys: list[str], stats: MergeStats, out: _Writer, *,
            where: str) -> None:
    """The k-way merge of ``readers`` (each yields sorted, consolidated tables in order).

    Each input keeps its loaded, not yet emitted rows (``pending``, still sorted). A round
    takes the bound (the smallest last-loaded row of the inputs still being read), cuts
    from every input the prefix strictly below it (a binary search: the rows are sorted),
    sorts and consolidates only those prefixes together, and loads the next batch of the
    input that set the bound. Every row is sorted once, not once per round it waits.
    """
    pending: list[pa.Table | None] = [None] * len(readers)
    last: dict[int, RowKey] = {}  # input -> the key of its last loaded row, inputs not exhausted

    def load(i: int) -> None:
        for t in readers[i]:
            if t.num_rows == 0:
                continue
            p = pending[i]
            pending[i] = t if p is None or p.num_rows == 0 else pa.concat_tables([p, t])
            last[i] = row_key(t, t.num_rows - 1, keys)
            return
        last.pop(i, None)

    for i in range(len(readers)):
        load(i)
    while last:
        stats.rounds += 1
        setter = min(last, key=last.__getitem__)
        bound = last[setter]
        emit: list[pa.Table] = []
        for i, p in enumerate(pending):
            n = 0 if p is None else rows_below(p, bound, keys)
            if p is not None and n:
                emit.append(p.slice(0, n))
                pending[i] = p.slice(n)
        stats.peak_rows = max(stats.peak_rows, sum(p.num_rows for p in pending if p is not None)
                              + sum(e.num_rows for e in emit))
        if emit:
            out.write(consolidate(pa.concat_tables(emit), keys, where=where))
        load(setter)
    rest = [p for p in pending if p is not None and p.num_rows]
    if rest:
        tail = pa.concat_tables(rest)
        stats.peak_rows = max(stats.peak_rows, tail.num_rows)
        out.write(consolidate(tail, keys, where=where))
