"""The landing world's write slot with pyarrow (what the Spark write job does, without Spark), the
clean drain that ends a landing schedule, and the landing model's final check.

:class:`ZoneWriter` runs one slot as :func:`shardsink.spark.job.write_slot` does: the head read
once (a description already committed stages nothing), the shard's seals as of that head
(:func:`shardsink.sinks.seals.seals`), the mint's plan (:func:`shardsink.sources.landing.index.get_plan`;
none for a description minted with a listing is :class:`shardsink.sources.landing.PlanMissingError`,
as :meth:`~shardsink.sources.landing.LandingSource.read_slot` raises), then per file the library
functions the Spark executors call: the late check from the plan
(:func:`shardsink.sources.landing.files.check_late_at`), the bounded read of an indexed file
(:func:`shardsink.sources.landing.read.stream_rows`) or the whole read and late check of one the
index could not hold (:func:`~shardsink.sources.landing.files.read_landing_file`,
:func:`~shardsink.sources.landing.files.check_late`); then staging and the manifest as the direct
world does. A refused file (late or malformed) is recorded in the ledger (the key the error names).

:func:`drain` ends a landing schedule: the producer publishes a watermark past every time, and
clean DAG runs (no fault, no crash, no interleaving: the store answers at once) catch the shard up
to it; a run refused a file has it moved out by the operator (the runbook's fix) and runs again.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.schema import current
from shardsink.core.updates import TIME
from shardsink.sinks.append import Appended, append_run
from shardsink.sinks.description import Description, NoOp
from shardsink.sinks.ingest import committed, mint_chain
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources.landing import LandingSource, LateDataError, MalformedInputError, PlanMissingError
from shardsink.sources.landing.files import LandingFile, check_late, check_late_at, read_landing_file, slot_of
from shardsink.sources.landing.index import get_plan
from shardsink.sources.landing.read import stream_rows
from shardsink_dev.sim.ctx import DAG, SHARD_URL, Sim
from shardsink_dev.sim.landing import Producer, ZoneModel


class ZoneWriter:
    """The landing world's write slot (module docstring)."""

    def __init__(self, source: LandingSource) -> None:
        self.source = source
        self._named = re.compile(re.escape(source.root) + r"/(\S+?\.parquet)")

    def write(self, sim: Sim, desc: Description, slot: int, slots: int) -> None:
        shard = sim.shard()
        head = shard.reader().head()
        if committed(shard, desc, head=head) is not None:
            return
        schema, schema_id = head.header.schema, current(head.header).id
        try:
            tables, inputs = self._read(sim, desc, slot, slots, seals(shard, head=head), schema)
        except (LateDataError, MalformedInputError) as e:
            m = self._named.search(str(e))
            sim.ledger.refused[m.group(1) if m else "?"] = str(e)[:200]
            raise
        rows = pa.concat_tables(tables) if tables else pa.table({**{f.name: pa.array([], f.type) for f in schema},
                                                                 TIME: pa.array([], pa.int64())})
        table = rows.append_column("_diff", pa.array([1] * rows.num_rows, pa.int64()))
        staged = shard.writer().stage(table, lower=desc.lower, upper=desc.upper, desc_id=desc.desc_id, schema=schema)
        write_manifest(shard, desc, slot=slot, slots=slots, parts=staged.parts, inputs=inputs, schema_id=schema_id)

    def _read(self, sim: Sim, desc: Description, slot: int, slots: int, seal_list: list[Any],
              schema: pa.Schema) -> tuple[list[pa.Table], list[dict[str, Any]]]:
        src, lower, upper = self.source, desc.lower, desc.upper
        plan = get_plan(SHARD_URL, desc_id=desc.desc_id, lower=lower, upper=upper, root=src.root,
                        time_column=src.time_column)
        if plan is None and desc.listing is not None:
            raise PlanMissingError(f"description {desc.desc_id} has no readable file plan", value=desc.desc_id)
        blob, out = src.blob(), []
        if plan is None:  # minted without a plan: list and read every file of the slot whole
            files = [(f, False) for f in src.files(window=(lower, upper), blob=blob) if slot_of(f.key, slots) == slot]
        else:
            judged = [(e.key, e.tmin, e.first_seen) for e in plan.read] + [(o.key, o.tmin, o.first_seen)
                                                                            for o in plan.older]
            for key, tmin, seen in judged:
                if slot_of(key, slots) == slot and tmin is not None:
                    check_late_at(tmin, key, seen, lower=lower, seals=seal_list, root=src.root)
            files = [(LandingFile(e.key, e.size, e.modified, e.identity), True) for e in plan.read
                     if slot_of(e.key, slots) == slot]
            files += [(LandingFile(u.key, u.size, u.modified, u.identity), False) for u in plan.unindexed
                      if slot_of(u.key, slots) == slot]
        for f, indexed in files:
            if indexed:
                out += list(stream_rows(blob, f, schema, src.time_column, root=src.root, window=(lower, upper)))
                continue
            t = read_landing_file(blob, f, schema, src.time_column, root=src.root, window=(lower, upper))
            check_late(t, f, lower=lower, seals=seal_list, root=src.root)
            out.append(t.filter(pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper))))
        return out, [{"key": f.key, "size": f.size, "modified": f.modified} for f, _ in files]


def drain(sim: Sim, producer: Producer, writer: ZoneWriter, end: int) -> None:
    """Catch the shard up past every time (module docstring); outside every actor."""
    producer.publish(end)
    slots = sim.plan.slots
    for k in range(16):
        shard = sim.shard()
        info = shard.info()
        if info.upper is None or info.upper >= end:
            return
        out = mint_chain(shard, writer.source, interval_end=end, max_span=None, max_chain=1,
                         dag_id=DAG, run_id="drain", attempt=k + 1)
        if isinstance(out, NoOp):
            raise sim.violation("drain-stuck", f"the drain minted nothing: {out.reason}")
        for d in out:
            sim.ledger.minted[d.desc_id], sim.ledger.run_of[d.desc_id] = d, "drain"
            sim.checker.lowers[d.desc_id] = d.lower
        try:
            for d in out:
                for s in range(slots):
                    writer.write(sim, d, s, slots)
        except (LateDataError, MalformedInputError) as e:
            m = writer._named.search(str(e))
            if m is None:
                raise sim.violation("refusal-names-no-file", str(e)[:300]) from e
            producer.remove(m.group(1))
            continue
        res = append_run(shard, out, slots, writer=f"airflow:{DAG}/drain")
        if isinstance(res, Appended):
            sim.ledger.acked.update(x.desc.desc_id for x in res.landed)
    raise sim.violation("drain-stuck", "the drain did not catch the shard up in 16 runs")


def check_zone(sim: Sim, model: ZoneModel) -> None:
    """The landing model's final check (module docstring of :mod:`shardsink_dev.sim.landing`)."""
    shard = sim.shard()
    info = shard.info()
    refused = set(sim.ledger.refused)
    wrongly = sorted(k for k in refused if k not in model.late)
    if wrongly:
        raise sim.violation("on-time-file-refused", f"{wrongly[0]}: {sim.ledger.refused[wrongly[0]]}")
    upper = info.upper if info.upper is not None else 2**62
    feed = shard.changes(info.since, upper).to_pylist() if upper > info.since else []
    got: Counter[tuple[str, int]] = Counter()
    for r in feed:
        got[(r["k"], r["n"])] += r["_diff"]
    must, may = model.expected(upper, refused)
    twice = sorted(r for r, c in got.items() if c > 1 or c < 0)
    phantom = sorted(r for r, c in got.items() if c and r not in may)
    dropped = sorted(r for r in must if got[r] != 1)
    if twice or phantom or dropped:
        keys = {r[0].split(".")[0] for r in dropped[:1]}
        raise sim.violation("landed-rows-differ", f"twice {twice[:3]}, from nowhere {phantom[:3]}, neither ingested "
                                                  f"once nor refused {dropped[:3]} (contents {sorted(keys)})")
