"""Reading merge inputs, and sorting unordered parts into sorted runs in bounded memory.

The streaming merge (:mod:`shardsink.maintenance.merge`) needs every input sorted by the
user columns then ``_time`` (and consolidated). Sorted parts are (their
:attr:`~shardsink.core.state.PartMeta.order` is ``"sorted"``, the default of every part
written before orders existed); an *unordered* part (the fast ingest path) may hold its
rows in any order and repeat a ``(row, _time)``. :func:`sort_runs` turns unordered input
into sorted runs, as an external sort's first phase does:

1. read the inputs record batch by record batch (times below ``since`` advanced to it),
   filling a *chunk* of at most ``chunk_bytes`` decoded bytes;
2. consolidate each full chunk (:func:`shardsink.core.consolidate.consolidate`: sort, sum
   equal ``(row, _time)``, drop zero sums) into a sorted run and *spill* it to a temporary
   Parquet file (row groups of ``row_group_rows``, so the merge streams it back in small
   steps), then let the chunk go;
3. the last chunk stays in memory as a run (it is at most one chunk).

The merge then reads runs exactly like sorted parts (:meth:`Run.batches`). Memory of this
phase: one input's compressed bytes and one decoded row group, the chunk being filled, and
while a chunk is consolidated its sorted copy and the sort's integer codes: about
:data:`SORT_FACTOR` chunks in all, so a budget of ``B`` bytes sorts chunks of ``B /
SORT_FACTOR``. Spill files live in a temporary folder the caller owns and removes.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import floats as fl
from shardsink.core.consolidate import consolidate_partial
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError

#: Peak decoded memory of sorting a chunk, in chunks: the chunk, its sorted copy, the sort's
#: codes and the summed copy (rows with duplicates), and the spill's encoding buffers.
SORT_FACTOR = 4


def full_schema(schema: pa.Schema) -> pa.Schema:
    """The stored columns of a shard with user schema ``schema``: user columns, ``_time``, ``_diff``."""
    return pa.schema([*schema, pa.field(TIME, pa.int64(), False), pa.field(DIFF, pa.int64(), False)])


def advance(table: pa.Table, since: int) -> pa.Table:
    """``table`` with every ``_time`` below ``since`` set to ``since`` (monotone: order is kept)."""
    t = table.column(TIME)
    if table.num_rows == 0 or pc.min(t).as_py() >= since:
        return table
    i = table.schema.get_field_index(TIME)
    return table.set_column(i, table.schema.field(i), pc.max_element_wise(t, pa.scalar(since, pa.int64())))


def part_batches(f: pq.ParquetFile, p: PartMeta, url: str, full: pa.Schema, since: int,
                 batch_rows: int) -> Iterator[pa.Table]:
    """Part ``p`` (opened as ``f``) in record batches of at most ``batch_rows``: stored columns,
    canonical floats, times advanced to ``since``; CorruptionError naming the part if unreadable."""
    try:
        for rb in f.iter_batches(batch_size=batch_rows, columns=full.names):
            yield advance(fl.canonical_table(pa.Table.from_batches([rb]).cast(full)), since)
    except CorruptionError:
        raise
    except Exception as e:
        raise CorruptionError(f"part {url}/{p.key} is unreadable: {type(e).__name__}: {e}") from e


#: A row's sort key as Python values (:func:`row_key`).
RowKey = tuple[tuple[int, Any], ...]


def row_key(table: pa.Table, j: int, keys: Sequence[str]) -> RowKey:
    """Row ``j`` of ``table`` as a tuple that Python orders exactly as the merge's sort does
    (:func:`shardsink.core.consolidate.consolidate`, ``pc.sort_indices`` with nulls last): per
    column ``(0, value)``, NaN ``(1, 0)`` after every number, null ``(2, 0)`` last. Temporal
    values compare as their integers; strings by code point (UTF-8's byte order), binary by
    bytes. Floats are canonical on read (-0.0 is 0.0, :mod:`shardsink.core.floats`)."""
    out: list[tuple[int, Any]] = []
    for k in keys:
        s = table.column(k)[j]
        if not s.is_valid:
            out.append((2, 0))
            continue
        t = s.type
        if pa.types.is_temporal(t) and not pa.types.is_interval(t):
            s = s.cast(pa.int32() if t.bit_width == 32 else pa.int64())
        v = s.as_py()
        out.append((1, 0) if isinstance(v, float) and math.isnan(v) else (0, v))
    return tuple(out)


def rows_below(table: pa.Table, bound: RowKey, keys: Sequence[str]) -> int:
    """How many leading rows of ``table`` (sorted) sort strictly below ``bound`` (binary search)."""
    lo, hi = 0, table.num_rows
    if hi == 0 or row_key(table, hi - 1, keys) < bound:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if row_key(table, mid, keys) < bound:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass
class Run:
    """A sorted, consolidated run of updates: in memory (``table``) or spilled (``path``).
    ``exact``: False if some key's sum in the run left int64 and its rows were kept unsummed
    (:func:`shardsink.core.consolidate.consolidate_partial`): merge it with the other runs."""

    rows: int
    table: pa.Table | None = None
    path: str | None = None
    exact: bool = True

    def batches(self, full: pa.Schema, batch_rows: int) -> Iterator[pa.Table]:
        """The run in order, at most ``batch_rows`` rows at a time (a spilled run: per row group
        at most, as Parquet decodes a row group at a time)."""
        if self.table is not None:
            for i in range(0, self.table.num_rows, batch_rows):
                yield self.table.slice(i, batch_rows)
            return
        assert self.path is not None
        f = pq.ParquetFile(self.path)
        for rb in f.iter_batches(batch_size=batch_rows):
            yield pa.Table.from_batches([rb]).cast(full)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How :func:`sort_runs` cuts and spills: decoded bytes per chunk, rows per record batch
    read, rows per row group of a spill file, and the folder spill files go to."""

    chunk_bytes: int
    batch_rows: int
    row_group_rows: int
    spill_dir: str


#: One input of :func:`sort_runs`: its index among the merge's inputs, the part, and a way to
#: open it (called once, when its turn comes: only one input's bytes are held at a time).
RunInput = tuple[int, PartMeta, Callable[[], pq.ParquetFile]]
#: Called with (input index, rows) for every record batch read (the merge's test hook).
OnRead = Callable[[int, int], None]


@dataclass
class RunStats:
    """What :func:`sort_runs` did: runs made, how many were spilled and their bytes, and the
    most rows it held in one chunk."""

    runs: int = 0
    spilled: int = 0
    spill_bytes: int = 0
    peak_rows: int = 0


def sort_runs(inputs: Sequence[RunInput], url: str, full: pa.Schema, keys: Sequence[str], since: int, *,
              options: RunOptions, stats: RunStats, on_read: OnRead | None = None) -> list[Run]:
    """Sorted, consolidated runs holding exactly the updates of ``inputs`` (any order), times
    advanced to ``since``: every full chunk spilled under ``options.spill_dir``, the last one
    in memory. No run when the inputs cancel out or are empty."""
    runs: list[Run] = []
    chunk: list[pa.Table] = []
    size = 0

    def cut(*, spill: bool) -> None:
        nonlocal size
        if not chunk:
            return
        table = pa.concat_tables(chunk)
        chunk.clear()
        size = 0
        stats.peak_rows = max(stats.peak_rows, table.num_rows)
        run, exact = consolidate_partial(table, keys, where=f"compaction of {url}")
        del table
        if run.num_rows == 0:
            return
        stats.runs += 1
        if not spill:
            runs.append(Run(run.num_rows, table=run, exact=exact))
            return
        path = os.path.join(options.spill_dir, f"run-{uuid.uuid4().hex}.parquet")
        pq.write_table(run, path, row_group_size=max(1, options.row_group_rows), compression="lz4")
        stats.spilled += 1
        stats.spill_bytes += os.path.getsize(path)
        runs.append(Run(run.num_rows, path=path, exact=exact))

    for i, p, open_ in inputs:
        for t in part_batches(open_(), p, url, full, since, options.batch_rows):
            if on_read is not None:
                on_read(i, t.num_rows)
            if t.num_rows == 0:
                continue
            chunk.append(t)
            size += t.nbytes
            if size >= options.chunk_bytes:
                cut(spill=True)
    cut(spill=False)
    return runs
