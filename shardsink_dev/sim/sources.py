"""The event-time source of the direct world, and its write slot (no landing zone, no Spark).

:class:`TickSource` is a source whose rows are a pure function of event time: one row per
``step`` milliseconds, ``(k="r<t>", n=t)`` at time ``t``, complete below a watermark that grows
with simulated time (one interval per ``period`` seconds). So the reference model of the shard's
contents is the source itself: as of ``t`` the shard holds exactly the source's rows with times
``<= t`` (and none twice), whatever interleaving, crash or lost answer happened.

:class:`TickWriter` is one write slot as the Spark write job runs it, with pyarrow: read the head
once and skip a description already committed (:func:`shardsink.spark.job.slot_facts`'s rule,
through :func:`shardsink.sinks.ingest.committed`), stage the slot's rows under the head's schema
(:meth:`shardsink.core.write.WriteHandle.stage`; a column a schema change added is written as
``n`` again, so contents stay checkable), and publish the slot's manifest with that version's
schema id (:func:`shardsink.sinks.staging.write_manifest`).
"""

from __future__ import annotations

import zlib
from typing import Any

import pyarrow as pa

from shardsink.core.schema import current
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import committed
from shardsink.sinks.staging import write_manifest
from shardsink_dev.sim.ctx import EPOCH, Sim

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])


def row_slot(k: str, slots: int) -> int:
    """The write slot of a row (stable: its key's CRC)."""
    return zlib.crc32(k.encode()) % slots


class TickSource:
    """See the module docstring. ``end``: the last time (exclusive) it will ever hold."""

    kind = "sim"

    def __init__(self, sim: Sim, *, step: int, period: float, end: int) -> None:
        self.sim, self.step, self.period, self.end = sim, step, period, end

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def schema(self) -> pa.Schema:
        return SCHEMA

    def watermark(self) -> int | None:
        done = int((self.sim.now() - EPOCH) / self.period) + 1
        return min(self.end, done * self.sim.plan.interval)

    def times(self, lower: int, upper: int) -> list[int]:
        """The source's event times in ``[lower, upper)``."""
        first = -(-lower // self.step) * self.step
        return list(range(first, min(upper, self.end), self.step))

    def rows(self, upper: int) -> dict[tuple[str, int], int]:
        """The model: every row with a time below ``upper``, by (k, n), with its time."""
        return {(f"r{t}", t): t for t in self.times(0, upper)}

    def rows_as_of(self, t: int) -> dict[tuple[str, int], int]:
        """The model as of ``t``: every row with a time ``<= t``."""
        return self.rows(t + 1)


class TickWriter:
    """The direct world's write slot (module docstring)."""

    def __init__(self, source: TickSource) -> None:
        self.source = source

    def write(self, sim: Sim, desc: Description, slot: int, slots: int) -> None:
        shard = sim.shard()
        head = shard.reader().head()
        if committed(shard, desc, head=head) is not None:
            return
        schema, schema_id = head.header.schema, current(head.header).id
        times = [t for t in self.source.times(desc.lower, desc.upper) if row_slot(f"r{t}", slots) == slot]
        cols: dict[str, Any] = {"k": [f"r{t}" for t in times], "n": times}
        for f in schema:
            if f.name not in cols:
                cols[f.name] = times  # a column a schema change added (int64, nullable)
        table = pa.table({**{f.name: pa.array(cols[f.name], f.type) for f in schema},
                          "_time": pa.array(times, pa.int64()), "_diff": pa.array([1] * len(times), pa.int64())})
        staged = shard.writer().stage(table, lower=desc.lower, upper=desc.upper, desc_id=desc.desc_id, schema=schema)
        write_manifest(shard, desc, slot=slot, slots=slots, parts=staged.parts, schema_id=schema_id)
