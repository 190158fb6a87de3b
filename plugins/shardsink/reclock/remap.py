"""The remap shard: a shard like any other whose updates are the source's bindings.

Schema ``(partition string, offset int64, name string, size int64)``. At binding time
``t`` its updates are ``-1`` for the old frontier's elements and ``+1`` for the new
ones (``name`` empty), and ``+1`` per file first bound then (partition ``#file``,
``offset`` = the file's ordinal, ``name`` = its key, ``size`` = its size in bytes).
See :mod:`shardsink.reclock.bindings` for what a binding means.

A binding for time ``T - 1`` is minted by compare-and-append of the batch
``[remap upper, T)`` (so the remap shard's upper is ``T`` afterwards). Losing the race
means someone else bound those times first: the loser re-reads and uses the winner's
bindings, never a second one for the same time. Times sealed without a binding (the
gap ``[remap upper, T - 1)``) keep the previous frontier.

SUBTLE (lost acknowledgement): every attempt uses a fresh description id. If an
attempt's commit landed but its answer was lost, the re-read shows the remap upper at
or past ``T`` and that landed binding is used; its parts are referenced. If it did not
land, its staged parts are leftovers that GC collects after the grace period (they are
never deleted on an unknown outcome).

SUBTLE (compaction): maintenance may compact the remap shard like any shard, but its
``since`` must stay at or below ``min(output uppers) - 1``, or the bindings needed to
resume can no longer be told apart (stamping then refuses with CorruptionError).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from shardsink.core.shard import Shard, default_writer
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import ShardExistsError, ShardNotFoundError, UnknownOutcomeError, UpperMismatchError
from shardsink.reclock.bindings import Binding, Bindings, BoundFile, Frontier, binding_rows, check_monotonic, replay
from shardsink.storage.retry import RetryPolicy

log = logging.getLogger("shardsink.reclock")

SCHEMA = pa.schema([("partition", pa.string()), ("offset", pa.int64()), ("name", pa.string()),
                    ("size", pa.int64())])

#: Minting a binding: re-read and retry after a lost race or an unknown outcome.
BIND = RetryPolicy("bind", attempts=12, first_wait=0.02, max_wait=1.0, deadline=120.0)


@dataclass(frozen=True)
class Proposal:
    """What the source offers to bind next: its current frontier and newly bound files."""

    frontier: Frontier
    files: tuple[BoundFile, ...] = ()


@dataclass(frozen=True)
class BindResult:
    """The bindings after :meth:`RemapShard.bind_through`; ``minted`` if this call minted one."""

    bindings: Bindings
    minted: bool


class RemapShard:
    """Handle on a remap shard (cheap; holds nothing but the shard handle)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.url = shard.url

    @classmethod
    def open(cls, url: str) -> RemapShard:
        """A handle; the first read raises ShardNotFoundError if there is no remap shard (no request now)."""
        return cls(Shard(url))

    @classmethod
    def create_if_missing(cls, url: str, *, initial_upper: int) -> RemapShard:
        """Create it empty at ``initial_upper`` (a creator that loses the race just uses the winner's)."""
        try:
            return cls(Shard.create(url, SCHEMA, upper=initial_upper))
        except ShardExistsError:
            return cls(Shard(url))

    @classmethod
    def open_or_create(cls, url: str, *, initial_upper: int) -> RemapShard:
        """Open it, or create it empty at ``initial_upper`` (two creators: the loser opens)."""
        try:
            return cls(Shard.open(url))
        except ShardNotFoundError:
            return cls.create_if_missing(url, initial_upper=initial_upper)

    def bindings(self) -> Bindings:
        """Every binding below the remap upper, from the state version a read lease pinned plus
        the remap's parts (:meth:`shardsink.core.read.ReadHandle.read_batch_parts`).

        Cost: the state head (twice: before and after the read's lease), the versions since the
        last rollup, one part per binding since the last compaction of the remap shard, and the
        lease's put and delete. Every part as stored (times never advanced to ``since``: a
        binding is its time), planned by :mod:`shardsink.core.plan` on the version the lease
        pinned, which the bindings are of.
        """
        # Projected by field id like every read (a remap shard's schema never evolves today).
        v, t = self.shard.reader().read_batch_parts(holder=f"remap-bindings@{default_writer()}")
        h = v.header
        upper = h.upper if h.upper is not None else 2**63 - 1
        cols = [t.column(c).to_pylist() for c in ("partition", "offset", "name", "size", TIME, DIFF)]
        return replay(zip(*cols, strict=True), upper=upper, since=h.since)

    def bind_through(self, target: int, propose: Callable[[Bindings], Proposal], *,
                     writer: str | None = None) -> BindResult:
        """Ensure ``target - 1`` is bound (remap upper ``>= target``); mint from ``propose`` if not.

        ``propose(bindings)`` is called with the current bindings and must return a
        frontier not behind ``bindings.latest()``; it is called again after a lost race.
        """
        minted = False

        def once() -> Bindings:
            nonlocal minted
            b = self.bindings()
            if b.upper >= target:
                return b
            prop = propose(b)
            old = b.latest()
            check_monotonic(old, prop.frontier, where=f"binding {self.url} at {target - 1}")
            rows = binding_rows(old, prop.frontier, prop.files)
            table = pa.Table.from_pylist(
                [{**{k: r[k] for k in ("partition", "offset", "name", "size")}, TIME: target - 1,
                  DIFF: r["diff"]} for r in rows],
                schema=pa.schema([*SCHEMA, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]))
            # A lost race raises UpperMismatchError after append deleted what it staged (its
            # fate check keeps anything committed); BIND then re-reads.
            self.shard.append(table, lower=b.upper, upper=target, desc_id=f"bind-{target - 1}-{uuid.uuid4().hex[:12]}",
                              writer=writer, schema=SCHEMA)
            minted = True
            log.info("bound %s at time %d on %s (%d new files)", dict(prop.frontier), target - 1, self.url,
                     len(prop.files))
            new = (Binding(target - 1, dict(prop.frontier), tuple(prop.files)),) if rows else ()
            return Bindings(upper=target, since=b.since, history=(*b.history, *new))

        out = BIND.call(once, retry_on=lambda e: isinstance(e, UpperMismatchError | UnknownOutcomeError))
        return BindResult(out, minted)
