"""Random shard histories: at every retained snapshot, pyiceberg and Polars read exactly what
shardsink reads at that version, and the manifests (fastavro) list exactly its live parts.

Histories mix sorted and unordered appends, corrections (retractions), compaction, since
advances, GC and schema changes (add, drop, rename, widen), on the local folder and on S3.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.table import StaticTable

from shardsink import iceberg
from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.iceberg import layout
from shardsink.maintenance.compact import compact_batches
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.since import advance_since
from tests.iceberg.judge import iceberg_at, io_props, manifest_files, shard_at

OPS = ("append", "unordered", "correct", "compact", "since", "gc", "add", "drop", "rename", "widen")


@dataclass
class History:
    shard: Shard
    columns: dict[str, pa.DataType] = field(default_factory=lambda: {"k": pa.string(), "v": pa.int32()})
    fresh: int = 0

    def rows(self, n: int, lo: int, seed: int) -> pa.Table:
        cols: dict[str, Any] = {}
        for name, t in self.columns.items():
            cols[name] = pa.array([f"k{(seed + i) % 4}" for i in range(n)] if name == "k"
                                  else [(seed * 7 + i) % 5 for i in range(n)], t)
        cols["_time"] = pa.array([lo + (seed + i) % 10 for i in range(n)], pa.int64())
        cols["_diff"] = pa.array([1] * n, pa.int64())
        return pa.table(cols)

    def step(self, op: str, seed: int) -> None:
        s, head = self.shard, self.shard.reader().head().header
        upper = head.upper
        assert upper is not None
        if op in ("append", "unordered"):
            t = self.rows(1 + seed % 4, upper, seed)
            if op == "append":
                s.append(t, lower=upper, upper=upper + 10)
            else:
                d = f"u-{uuid.uuid4().hex[:8]}"
                staged = s.stage(t, lower=upper, upper=upper + 10, desc_id=d, order="unordered")
                s.compare_and_append([staged], expected_upper=upper, new_upper=upper + 10, desc_id=d)
        elif op == "correct" and upper > 0:
            now = s.snapshot()
            if now.num_rows:
                row = now.slice(seed % now.num_rows, 1).drop_columns(["_count"])
                t = row.append_column("_time", pa.array([upper], pa.int64())).append_column(
                    "_diff", pa.array([-1], pa.int64()))
                s.append(t, lower=upper, upper=upper + 10)
        elif op == "compact" and len(b := s.batches()) >= 2:
            i = seed % (len(b) - 1)
            with contextlib.suppress(InvalidUsageError):  # refused (a dropped column still shown): nothing written
                compact_batches(s, b[i:i + 2], since=head.since)
        elif op == "since" and upper > 1:
            advance_since(s, target=max(head.since, upper - 1 - seed % 15))
        elif op == "gc":
            collect(s, GcOptions(grace_s=0, retention=5 + seed % 20))
        elif op == "add":
            self.fresh += 1
            s.evolve(SchemaChange(kind="add", name=f"c{self.fresh}", type="int64"))
            self.columns[f"c{self.fresh}"] = pa.int64()
        elif op == "drop" and len(self.columns) > 2:
            name = [c for c in self.columns if c != "k"][seed % (len(self.columns) - 1)]
            s.evolve(SchemaChange(kind="drop", name=name))
            del self.columns[name]
        elif op == "rename":
            self.fresh += 1
            name = [c for c in self.columns if c != "k"][seed % (len(self.columns) - 1)]
            s.evolve(SchemaChange(kind="rename", name=name, new_name=f"r{self.fresh}"))
            self.columns = {(f"r{self.fresh}" if c == name else c): t for c, t in self.columns.items()}
        elif op == "widen" and (ints := [c for c, t in self.columns.items() if t == pa.int32()]):
            s.evolve(SchemaChange(kind="widen", name=ints[0], type="int64"))
            self.columns[ints[0]] = pa.int64()


def judge(shard: Shard) -> None:
    """Every retained snapshot: readable; where its shard version is retained, equal to it."""
    loc = iceberg.current_location(shard)
    meta = StaticTable.from_metadata(loc, properties=io_props(shard.url)).metadata
    head = shard.reader().head()
    assert meta.current_snapshot_id is not None
    for snap in meta.snapshots:
        v = shard.reader().version(layout.seqno_of_snapshot(snap.snapshot_id))
        got_cols, got, frame = iceberg_at(loc, snap.snapshot_id, shard.url)
        assert got == frame
        if v is None:  # its version went to GC: its files must still be there (read above)
            continue
        cols, want = shard_at(shard, v)
        assert (got_cols, got) == (cols, want), v.seqno
        live = {layout.location(shard.url, p.key) for b in shard.reader().batches(v) for p in b.parts}
        assert manifest_files(loc, snap.snapshot_id, shard.url) == live
    newest = max(meta.snapshots, key=lambda s: s.sequence_number)
    live = {layout.location(shard.url, p.key) for b in shard.reader().batches(head) for p in b.parts}
    assert manifest_files(loc, newest.snapshot_id, shard.url) == live


def run_history(url: str, ops: list[tuple[str, int]]) -> None:
    shard = Shard.create(url, pa.schema([("k", pa.string()), ("v", pa.int32())]))
    h = History(shard)
    h.step("append", 1)
    iceberg.enable(shard)
    for op, seed in ops:
        h.step(op, seed)
    judge(shard)
    assert iceberg.sync(shard) == 0  # the committing process kept it current: nothing to catch up


HISTORIES = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), min_size=3, max_size=9)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=HISTORIES)
def test_random_histories_local(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    run_history(f"file://{tmp_path_factory.mktemp('h')}/s", ops)


@pytest.mark.usefixtures("moto")
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=HISTORIES)
def test_random_histories_s3(ops: list[tuple[str, int]]) -> None:
    run_history(f"s3://shardsink-test/h-{uuid.uuid4().hex[:10]}", ops)
