"""A part whose diffs are implicit, read as if it held its ``_diff`` column of ones.

Spark's fast ingest path writes parts with exactly the user's rows and ``_time``
(:data:`shardsink.core.state.PartDiffs` ``"ones"``): every row's diff is 1, so the column is
not stored. :class:`OnesDiffFile` is the ``pq.ParquetFile`` such a part opens as
(:func:`shardsink.core.part_io.open_part`): ``iter_batches``, ``read``, ``read_row_group(s)``
and ``schema_arrow`` give the ``_diff`` column (int64, non-nullable, all 1) wherever the caller
asks for it, in the order asked, so every pyarrow-side reader (snapshots, change feeds, the
compaction merge, the Spark data source) reads both kinds of part through one code path.
``metadata`` stays the physical file's (row counts and sizes are what callers take from it).

SUBTLE: engines that scan part files themselves (DuckDB, Polars, Spark's own Parquet reader)
never see this class; they plan from :attr:`PartMeta.implicit_diffs` and supply the constant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardsink.core.updates import DIFF

DIFF_FIELD = pa.field(DIFF, pa.int64(), nullable=False)


def ones(n: int) -> pa.Array:
    """``n`` diffs of 1 (int64)."""
    return pa.array(np.ones(n, dtype=np.int64))


def with_ones(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    """``batch`` plus a ``_diff`` column of ones, in the order of ``columns`` (None: last)."""
    out = batch.append_column(DIFF_FIELD, ones(batch.num_rows))
    if columns is None:
        return out
    return out.select(list(columns))


class OnesDiffFile(pq.ParquetFile):
    """A ``"ones"`` part: the physical file, with ``_diff`` supplied on every read (module docstring)."""

    @property
    def schema_arrow(self) -> pa.Schema:
        return super().schema_arrow.append(DIFF_FIELD)

    @staticmethod
    def _physical(columns: Sequence[str] | None) -> list[str] | None:
        return None if columns is None else [c for c in columns if c != DIFF]

    @staticmethod
    def _wants(columns: Sequence[str] | None) -> bool:
        return columns is None or DIFF in columns

    def iter_batches(self, batch_size: int = 65536, row_groups: Any = None, columns: Any = None,
                     **kw: Any) -> Iterator[pa.RecordBatch]:
        for rb in super().iter_batches(batch_size=batch_size, row_groups=row_groups,
                                       columns=self._physical(columns), **kw):
            yield with_ones(rb, columns) if self._wants(columns) else rb

    def _table(self, t: pa.Table, columns: Sequence[str] | None) -> pa.Table:
        if not self._wants(columns):
            return t
        t = t.append_column(DIFF_FIELD, pa.chunked_array([ones(t.num_rows)], pa.int64()))
        return t if columns is None else t.select(list(columns))

    def read(self, columns: Any = None, **kw: Any) -> pa.Table:
        return self._table(super().read(columns=self._physical(columns), **kw), columns)

    def read_row_group(self, i: int, columns: Any = None, **kw: Any) -> pa.Table:
        return self._table(super().read_row_group(i, columns=self._physical(columns), **kw), columns)

    def read_row_groups(self, row_groups: Any, columns: Any = None, **kw: Any) -> pa.Table:
        return self._table(super().read_row_groups(row_groups, columns=self._physical(columns), **kw), columns)
