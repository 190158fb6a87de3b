"""Property test: schema evolution beside appends, retractions, compactions and since advances.

A hypothesis state machine drives one shard with random appends (inserts and retractions of
rows alive in the current schema), schema changes (add a nullable column, drop, rename, widen
int32 → int64 or string → large_string), compactions (random fan-in, streamed or one-shot),
since advances, and issue 19's sequence (a drop above since, then a compaction: as-of reads
before the drop must still see the column). An independent model keeps every update as
``field id → value`` and its own schema history (field ids, names, the upper at each change). After every step, every
snapshot at every readable time and a spread of change feeds equal the model projected by
field id, under the current schema and under the schema as of the read's time.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.schema_model import CREATE_SCHEMA, KINDS, Field, SchemaModel

from shardsink.core.shard import Shard
from shardsink.maintenance import CompactOptions, MergeOptions, ScheduleOptions, advance_since, compact


class EvolvingShard(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="shardsink-schema-prop-"))
        self.shard = Shard.create((self.tmp / "s").as_uri(), CREATE_SCHEMA)
        self.model = SchemaModel()  # the independent model: updates by field id, schema history

    @initialize()
    def start(self) -> None:
        pass

    @property
    def fields(self) -> list[Field]:
        return self.model.fields

    @property
    def upper(self) -> int:
        return self.model.upper

    @property
    def since(self) -> int:
        return self.model.since

    # --- rules ----------------------------------------------------------------------

    @rule(data=st.data(), span=st.integers(1, 3))
    def append(self, data: st.DataObject, span: int) -> None:
        rows = self.model.draw_append(data, span)
        self.shard.append(self.model.table(rows), lower=self.upper, upper=self.upper + span)
        self.model.appended(rows, span)

    @rule(data=st.data(), kind=st.sampled_from(KINDS))
    def evolve(self, data: st.DataObject, kind: str) -> None:
        drawn = self.model.draw_change(data, kind)
        if drawn is None:
            return
        self.shard.evolve(drawn[0])
        self.model.evolved(*drawn)

    @rule(fan_in=st.integers(2, 3), streamed=st.booleans())
    def compact(self, fan_in: int, streamed: bool) -> None:
        opts = CompactOptions(schedule=ScheduleOptions(fan_in=fan_in),
                              merge=MergeOptions(small_bytes=0 if streamed else 1 << 30, batch_rows=2))
        res = compact(self.shard, options=opts)
        assert all(m.status == "applied" for m in res.merges), res

    @precondition(lambda self: len(self.fields) > 1)
    @rule(data=st.data(), streamed=st.booleans())
    def drop_then_compact(self, data: st.DataObject, streamed: bool) -> None:
        """Issue 19's sequence, so every example can meet it: rows under the old schema, a drop
        at an upper above since, a compaction at once. As-of reads before the drop must still
        show the dropped column's values (the invariant); the column's data goes only once
        since passes the drop (a later advance and compaction)."""
        self.append(data, 2)
        self.evolve(data, "drop")
        self.append(data, 1)
        self.compact(2, streamed)

    @precondition(lambda self: self.upper > self.since + 1)
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.since, self.upper - 1))
        self.model.advanced(advance_since(self.shard, target=target).after)

    # --- checks ---------------------------------------------------------------------

    @invariant()
    def every_read_equals_the_model(self) -> None:
        if not hasattr(self, "shard") or self.upper <= self.since:
            return
        names = [n for _, n, _ in self.fields]
        for t in range(self.since, self.upper):
            for choice, fields in (("current", self.fields), ("as_of", self.model.schema_at(t))):
                snap = self.shard.snapshot(t, schema=choice)  # type: ignore[arg-type]
                assert snap.schema.names == [*(n for _, n, _ in fields), "_count"]
                got = Counter({tuple(r[n] for _, n, _ in fields): r["_count"] for r in snap.to_pylist()})
                assert got == self.model.snapshot(t, fields), (t, choice)
        for lo in range(self.since, self.upper + 1, 2):
            feed = self.shard.changes(lo, self.upper)
            got = Counter({(*(r[n] for n in names), r["_time"]): r["_diff"] for r in feed.to_pylist()})
            assert got == self.model.changes(lo, self.upper, self.fields), lo

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


EvolvingShard.TestCase.settings = settings(max_examples=8, stateful_step_count=14, deadline=None, database=None,
                                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_every_read_equals_the_model_under_the_schema_as_of_that_read = EvolvingShard.TestCase
