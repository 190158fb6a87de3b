"""The read handle: the head, versions and batch lists, parts, snapshots, changes, leases, history.

:class:`ReadHandle` (from :meth:`shardsink.core.shard.Shard.reader`) is every read a layer
above core makes of a shard, as persist's ``read.rs`` sits over its private machine. It hands
out typed values (:class:`~shardsink.core.state.Version`, batch and part records, Arrow
tables), never the machine, the blob or a key.

Contract: :meth:`ReadHandle.head` is one head read; callers that must decide several things
from the same state pass the version it returned on (:meth:`batches`, and
:meth:`shardsink.core.write.WriteHandle.fate`'s ``head``) rather than reading again.

What a snapshot or change feed loads (parts, time pruning, the schema every part projects onto)
is decided by :mod:`shardsink.core.plan` alone (:meth:`ReadHandle.plan`); this module reads a plan
with pyarrow (:meth:`ReadHandle.read_plan`) and consolidates it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import checks as ck
from shardsink.core import leases as ls
from shardsink.core import part_io as pio
from shardsink.core import plan as pl
from shardsink.core import schema as sch
from shardsink.core import state as st
from shardsink.core.commits import Commit
from shardsink.core.consolidate import consolidate
from shardsink.core.diff_sums import THREADED_ROWS, group_sums
from shardsink.core.machine import Machine, default_writer
from shardsink.core.plan import ReadPlan, SchemaChoice
from shardsink.core.updates import COUNT, TIME
from shardsink.errors import CorruptionError, ShardsinkError

__all__ = ["ReadHandle", "SchemaChoice", "ShardInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardInfo:
    url: str
    seqno: int
    upper: int | None
    since: int
    schema: pa.Schema
    stats: st.Stats
    rollup: int
    last_commit: Commit
    retention: int | None = None  # ms; None: all history


class ReadHandle:
    """Reads of the shard at ``url`` through its (private) commit machine."""

    def __init__(self, url: str, machine: Machine) -> None:
        self.url = url
        self._machine = machine

    # --- state --------------------------------------------------------------------

    def head(self) -> st.Version:
        """The newest state version (one head read: the hint, then a probe past it)."""
        return self._machine.head().version

    def info(self) -> ShardInfo:
        h = self.head()
        return ShardInfo(self.url, h.seqno, h.header.upper, h.header.since, h.header.schema,
                         h.header.stats, h.header.rollup, h.commit, h.header.retention)

    @property
    def schema(self) -> pa.Schema:
        return self.head().header.schema

    def version(self, seqno: int) -> st.Version | None:
        """State version ``seqno``; None if it does not exist (not yet, or collected by GC)."""
        return self._machine.fetch(ck.check_count(seqno, what="seqno", lo=0))

    def versions(self, seqnos: Iterable[int]) -> list[st.Version]:
        """The versions ``seqnos`` in that order, fetched in parallel; CorruptionError if one is missing."""
        return self._machine.fetch_many(seqnos)

    def batches(self, version: st.Version | None = None) -> tuple[st.BatchMeta, ...]:
        """The full live batch list at ``version`` (default: a fresh head)."""
        return self._machine.full_batches(version if version is not None else self.head())

    def log(self, *, limit: int = 20, head: st.Version | None = None) -> list[tuple[int, Commit]]:
        """Commits newest first: ``(seqno, commit info)``, back to the oldest retained version.

        GC deletes versions oldest first, so the history ends at the first missing one.
        ``head``: from a version the caller already read (:meth:`head`), else a fresh head read.
        """
        return [(v.seqno, v.commit) for v in self.history(limit=limit, head=head)]

    def history(self, *, limit: int = 20, head: st.Version | None = None) -> list[st.Version]:
        """The versions behind :meth:`log` (commit info and diff), newest first."""
        ck.check_count(limit, what="log limit", lo=1)
        head = head if head is not None else self.head()
        seqnos = range(head.seqno, max(-1, head.seqno - limit), -1)
        return self._machine.fetch_upto_gap(seqnos)

    # --- parts --------------------------------------------------------------------

    def read_parts(self, parts: Sequence[st.PartMeta], schema: pa.Schema) -> pa.Table:
        """The rows of ``parts`` (user columns of ``schema`` + ``_time`` + ``_diff``), read in
        parallel; every part must have been written with ``schema`` (else :meth:`read_batch_parts`)."""
        return pio.read_parts(self._machine.blob, parts, schema)

    def read_batch_parts(self, keys: Sequence[str] | None = None, *, schema: Literal["current"] | int = "current",
                         head: st.Version | None = None, holder: str | None = None) -> tuple[st.Version, pa.Table]:
        """Parts as stored, under a read lease: every live part (``keys`` None) or the parts of
        ``keys`` an earlier read of the state named (CorruptionError naming one no longer live),
        their rows (user columns of ``schema``, the current one or a schema id, + ``_time`` +
        ``_diff``), no time filtered or advanced. :mod:`shardsink.core.plan` decides it all: the
        schema on ``head`` (a version the caller read; default a fresh head read), the lease
        (:func:`~shardsink.core.plan.pin_parts`, held by ``holder``) and the parts, those of the
        version read after the lease (:func:`~shardsink.core.plan.plan_parts`). Returns that
        version and the rows; the lease is released first (LeaseLostError if it was lost
        meanwhile: the read may not have been protected)."""
        head = head if head is not None else self.head()
        target = pl.parts_schema(head.header, schema, url=self.url)
        keeper = ls.LeaseKeeper()
        try:
            pinned = pl.pin_parts(self, keeper, head, holder=holder or f"parts-read@{default_writer()}")
            data = self.read_plan(pl.plan_parts(self.url, pinned, self.batches(pinned), target, keys=keys))
        except BaseException:
            _close_quietly(keeper)
            raise
        keeper.close()
        return pinned, data

    def plan(self, as_of: int | None = None, *, changes: tuple[int, int] | None = None,
             schema: SchemaChoice | int = "current") -> ReadPlan:
        """The plan (:func:`shardsink.core.plan.plan`) of the snapshot at ``as_of`` (default
        ``upper - 1``) or, with ``changes``, of the feed ``[lower, upper)``, on one head version
        (no lease). ReadFrontierError / InvalidUsageError on bad bounds or a bad ``schema``."""
        v = self.head()
        bounds = pl.Bounds.resolve(self.url, v.header, as_of=as_of, changes=changes)
        target = pl.reader_schema(v.header, schema, bounds, url=self.url)
        return pl.plan(self.url, v, self.batches(v), bounds, target)

    def read_plan(self, plan: ReadPlan | pl.PartsPlan) -> pa.Table:
        """The updates ``plan`` loads (its user columns + ``_time`` + ``_diff``), read in parallel.
        A :class:`~shardsink.core.plan.PartsPlan`: its parts' rows, times as stored.

        Each part is filtered to the read's times BEFORE projecting: a part compacted from newer
        data may hold values (e.g. ``2**40`` in a column widened to int64) that an older,
        narrower target cannot hold, outside the read's times. A row inside them that does not
        fit is corruption (CorruptionError naming the column). Times below ``since`` are then
        read as ``since`` where the plan advances them.
        """
        if isinstance(plan, pl.PartsPlan):
            return self._read(plan.parts, plan.target, plan.schema, (None, None))
        data = self._read(plan.parts, plan.target, plan.schema, (plan.lower, plan.upper))
        if plan.advance and data.num_rows:
            i = data.schema.get_field_index(TIME)
            data = data.set_column(i, data.schema.field(i),
                                   pc.max_element_wise(data[TIME], pa.scalar(plan.since, pa.int64())))
        return data

    def _read(self, reads: Sequence[pl.PartRead], target: st.SchemaEntry, schema: pa.Schema,
              times: tuple[int | None, int | None]) -> pa.Table:
        parts = [r.part for r in reads]
        if not any(r.cut for r in reads) and all(r.schema_id == target.id for r in reads):
            return pio.read_parts(self._machine.blob, parts, schema)
        sources = []
        for r in reads:
            proj = partial(sch.project, source=r.source, target=target, where=f"shard {self.url}")
            if r.cut:
                proj = partial(_filtered, times=(times[0] if r.below else None, times[1] if r.above else None),
                               then=proj)
            sources.append((r.written, proj))
        return pio.read_parts(self._machine.blob, parts, schema, sources=sources)

    def open_part(self, part: st.PartMeta, *, referenced_by: str = "the shard state") -> pq.ParquetFile:
        """One part, opened for streaming reads; CorruptionError naming ``referenced_by`` if missing."""
        return pio.open_part(self._machine.blob, part, referenced_by=referenced_by)

    # --- contents -----------------------------------------------------------------

    def snapshot(self, as_of: int | None = None, *, schema: SchemaChoice = "current") -> pa.Table:
        """Consolidated contents as of ``as_of`` (default upper - 1): user columns + ``_count``.

        Requires ``since <= as_of < upper``. Raises CorruptionError on a count outside int64
        (exact sums, :mod:`shardsink.core.diff_sums`; checked first) or a negative count.
        Columns are those of the ``schema`` choice (:func:`shardsink.core.plan.reader_schema`),
        every part projected.
        """
        plan = self.plan(as_of, schema=schema)
        data = self.read_plan(plan)
        summed = group_sums(data, list(plan.columns), name=COUNT, where=f"shard {self.url} as of {plan.as_of}",
                            use_threads=data.num_rows >= THREADED_ROWS)
        lowest = pc.min(summed[COUNT]).as_py()
        if lowest is not None and lowest < 0:
            negative = summed.filter(pc.less(summed[COUNT], 0))
            row = negative.slice(0, 1).to_pylist()[0]
            raise CorruptionError(
                f"shard {self.url} has {negative.num_rows} rows with negative multiplicity as of {plan.as_of}, "
                f"e.g. {row}"
            )
        if lowest is None or lowest > 0:
            return summed  # nothing retracted to zero: skip copying every row through a filter
        return summed.filter(pc.greater(summed[COUNT], 0))

    def changes(self, lower: int, upper: int, *, schema: SchemaChoice = "current") -> pa.Table:
        """The consolidated updates with ``lower <= _time < upper`` (requires since <= lower).

        Times are read advanced by ``since`` (a time ``t < since`` reads as ``since``), as
        compaction may have stored them: so ``changes(since, x)`` starts with the whole
        history before ``since`` collapsed at ``since``, and the result is the same before
        and after any compaction. Columns are those of the ``schema`` choice
        (:func:`shardsink.core.plan.reader_schema`; ``"as_of"``: the schema current at
        ``max(lower, upper - 1)``). CorruptionError if a ``_diff`` sum leaves int64 (exact sums,
        never wrapped).
        """
        plan = self.plan(changes=(lower, upper), schema=schema)
        return consolidate(self.read_plan(plan), [*plan.columns, TIME],
                           where=f"shard {self.url} changes [{lower}, {upper})")

    # --- leases -------------------------------------------------------------------

    def leases(self, *, now: float | None = None) -> list[ls.Lease]:
        """Live read leases (oldest first); see :mod:`shardsink.core.leases`."""
        return ls.live_leases(self, now=now)

    def min_leased_as_of(self, *, now: float | None = None) -> int | None:
        """The lowest ``as_of`` a live lease holds: compaction must keep ``since`` at or below it."""
        return ls.min_leased_as_of(self, now=now)


def _close_quietly(keeper: ls.LeaseKeeper) -> None:
    """Release ``keeper``'s leases on the way out of a failed read (the read's own error wins)."""
    try:
        keeper.close()
    except ShardsinkError as e:
        log.warning("releasing the lease of a failed read: %s", e)


def _filtered(table: pa.Table, *, times: tuple[int | None, int | None],
              then: Callable[[pa.Table], pa.Table]) -> pa.Table:
    """``then`` of the rows of ``table`` (a part as written) with ``lo <= _time < hi`` (None: unbounded)."""
    lo, hi = times
    keep = None if hi is None else pc.less(table[TIME], hi)
    if lo is not None:
        low = pc.greater_equal(table[TIME], lo)
        keep = low if keep is None else pc.and_(keep, low)
    return then(table if keep is None else table.filter(keep))
