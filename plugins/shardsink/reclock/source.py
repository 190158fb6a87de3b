"""What every reclocked source shares: binding on mint, resumption, routing, health.

A reclocked source is a :class:`shardsink.sources.base.Source` whose ``watermark()`` is
not an event time but the remap shard's upper, plus the two hooks the ingest steps call
(:class:`Reclocked`):

* ``bind_through(target, shard_url=, lower=)`` (mint): make sure time ``target - 1`` is
  bound, minting a binding from the source's current progress if it is not; returns
  the time up to which the description may go (``target``).
* ``after_commit(shard_url)`` (append): publish the resumption frontier upstream (Kafka
  consumer-group offsets); a no-op for sources without such a place. The append step
  reaches it from a spec through :func:`shardsink.sources.publish.after_commit`.

Layering: ``sources/`` builds on ``reclock/`` (records are conformed and stamped by
:func:`shardsink.sources.stamp.stamp`), never the other way round.

Several output shards (``outputs``: name -> shard URL) may share one source and one
remap shard: every record is routed by the value of its ``route_by`` column, and the
source object of the DAG writing output ``o`` is ``source.for_output(o)``. Each output
is exactly-once on its own (same bindings, same stamping); the resumption frontier is
the minimum over all outputs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError, ShardNotFoundError, ShardsinkError
from shardsink.reclock import bound_input as inputs
from shardsink.reclock import health
from shardsink.reclock.bindings import Bindings
from shardsink.reclock.remap import Proposal, RemapShard
from shardsink.storage.url import parse_url


@runtime_checkable
class Reclocked(Protocol):
    """The two hooks of a reclocked source (see the module docstring)."""

    def bind_through(self, target: int, *, shard_url: str, lower: int) -> int: ...

    def after_commit(self, shard_url: str) -> None: ...


def reclocked_upper(source: Reclocked, *, shard_url: str, lower: int, interval_end: int | None,
                    max_span: int | None, now_ms: int | None = None) -> int:
    """What mint uses as the source's "watermark": the bound target time, or ``lower`` if none.

    The target is the interval end capped at now (and at ``lower + max_span``): a binding
    is never minted for a future time, so data arriving later is always bound later.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    target = min(t for t in (interval_end, now, None if max_span is None else lower + max_span) if t is not None)
    if target <= lower:
        return lower
    return source.bind_through(target, shard_url=shard_url, lower=lower)


@dataclass(frozen=True)
class Routing:
    """``outputs``: output name -> shard URL; ``route_by``: the column naming a row's output."""

    outputs: Mapping[str, str] = field(default_factory=dict)
    route_by: str | None = None
    output: str | None = None

    def __post_init__(self) -> None:
        if self.outputs and not self.route_by:
            raise InvalidUsageError(f"outputs {sorted(self.outputs)} need route_by (the column naming the output)")
        if self.output is not None and self.output not in self.outputs:
            raise InvalidUsageError(f"output {self.output!r} is not one of {sorted(self.outputs)}")

    def spec(self) -> dict[str, Any]:
        if not self.outputs:
            return {}
        return {"outputs": {k: str(parse_url(v)) for k, v in self.outputs.items()}, "route_by": self.route_by,
                "output": self.output}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Routing:
        return cls(dict(spec.get("outputs") or {}), spec.get("route_by"), spec.get("output"))

    def shard_urls(self, shard_url: str | None) -> list[str]:
        urls = {str(parse_url(u)) for u in self.outputs.values()}
        if shard_url is not None:
            urls.add(str(parse_url(shard_url)))
        return sorted(urls)

    def select(self, table: pa.Table, *, where: str) -> pa.Table:
        """The rows routed to this output (all rows without routing); refuse unknown routes."""
        if not self.outputs:
            return table
        assert self.route_by is not None
        if self.route_by not in table.column_names:
            raise InvalidUsageError(f"{where}: no routing column {self.route_by!r}")
        col = table[self.route_by].cast(pa.string())
        known = pc.is_in(col, value_set=pa.array(sorted(self.outputs)))
        if not pc.all(known).as_py():
            bad = pc.unique(table.filter(pc.invert(pc.fill_null(known, False)))[self.route_by]).to_pylist()[:5]
            raise InvalidUsageError(
                f"{where}: {self.route_by} values {bad} name no output; expected one of {sorted(self.outputs)}")
        if self.output is None:
            raise InvalidUsageError("a routed source must be given its output: source.for_output(name)")
        return table.filter(pc.equal(col, self.output))


def resumption(bindings: Bindings, shard_urls: list[str]) -> tuple[dict[str, int], int | None]:
    """``(F(min upper - 1), min upper)`` over the output shards; a missing shard holds nothing."""
    uppers = []
    for u in shard_urls:
        try:
            up = Shard.open(u).info().upper
        except ShardNotFoundError:
            return {}, None
        if up is not None:
            uppers.append(up)
    if not uppers:
        return bindings.latest(), None
    low = min(uppers)
    if low - 1 >= bindings.upper:
        return bindings.latest(), low
    try:
        return bindings.frontier_at(low - 1), low
    except ShardsinkError:
        return {}, low


class ReclockedBase:
    """Shared implementation: subclasses provide ``kind``, ``spec()``, ``propose()`` and ``read_slot()``."""

    kind = "reclocked"

    def __init__(self, *, remap: str, routing: Routing) -> None:
        self.remap_url = str(parse_url(remap))
        self.routing = routing

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def propose(self, bindings: Bindings) -> Proposal:
        """The source's current progress, not behind ``bindings.latest()``."""
        raise NotImplementedError

    def remap(self) -> RemapShard:
        return RemapShard.open(self.remap_url)

    def watermark(self) -> int | None:
        """The remap shard's upper: every time below it is bound (None before the first binding)."""
        try:
            return self.remap().shard.info().upper
        except ShardNotFoundError:
            return None

    def bind_through(self, target: int, *, shard_url: str, lower: int) -> int:
        """Bind ``target - 1`` if needed; publish the description's bound input; return ``target``.

        Requests on the happy path: the outputs' pointers (one PUT each), the remap shard's
        state and binding parts, the source listing, and (when minting) one part, one state
        version, the hint; plus the bound input.
        """
        # SUBTLE: the outputs' pointer to their remap shard (reclock.json) is written first, on
        # every mint: a mint that dies right after its binding commits must not leave an output
        # without it (no later mint would write it), and an output added to an existing remap
        # shard must get one too. A plain put of a pure function of the spec: idempotent.
        for url in self.routing.shard_urls(shard_url):
            health.write_sidecar(url, self.remap_url, self.spec())
        remap = RemapShard(Shard(self.remap_url))
        try:
            try:
                got = remap.bind_through(target, self.propose, writer=f"reclock:{self.kind}")
            except ShardNotFoundError:
                remap = RemapShard.create_if_missing(self.remap_url, initial_upper=lower)
                got = remap.bind_through(target, self.propose, writer=f"reclock:{self.kind}")
        except ShardsinkError as e:
            health.record_failure(self.remap_url, f"{type(e).__name__}: {e}")
            raise
        inputs.publish(self.remap_url, got.bindings, lower, target)
        return target

    def bound_input(self, lower: int, upper: int) -> inputs.BoundInput:
        """The bound input of the description ``[lower, upper)`` (published by mint, else rebuilt)."""
        return inputs.load(self.remap_url, lower, upper)

    def after_commit(self, shard_url: str) -> None:
        """Nothing to publish by default."""

    def resumption(self, shard_url: str | None = None) -> tuple[dict[str, int], int | None]:
        return resumption(self.remap().bindings(), self.routing.shard_urls(shard_url))

