"""Helpers of the GC and verify tests: shards with a history (both backends via ``shard_url``).

``small_windows`` (a fixture, re-exported by this folder's conftest.py) shrinks the
idempotency window (4 descriptions) and the rollup cadence (every 4 versions) so that
a few dozen commits exercise what takes thousands in production. ``compact_like``
commits, through ``Machine.commit`` (a ``CompactCommand``), a version that replaces
batches by one merged batch staged from their changes, without the compaction module's
planning and merging.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core import state as st
from shardsink.core.commands import CompactCommand
from shardsink.core.shard import StagedBatch

SCHEMA = pa.schema([("k", pa.string())])
SPAN = 10


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardsink.core.transitions.RECENT_DESCS", 4)
    monkeypatch.setattr("shardsink.core.machine.ROLLUP_EVERY", 4)


def rows(i: int) -> pa.Table:
    """Batch ``d<i>``'s rows: two keys at times inside ``[10 i, 10 i + 10)``."""
    return pa.table({"k": [f"k{i}a", f"k{i}b"], "_time": [SPAN * i, SPAN * i + 3]})


def append_days(shard: Shard, start: int, count: int) -> None:
    for i in range(start, start + count):
        shard.append(rows(i), lower=SPAN * i, upper=SPAN * (i + 1), desc_id=f"d{i}")


def compact_like(shard: Shard, ids: list[str], new_id: str) -> st.Version:
    """Replace the live batches ``ids`` (adjacent, in order) by one merged batch ``new_id``."""
    live = {b.desc_id: b for b in shard.batches()}
    lower, upper = live[ids[0]].lower, live[ids[-1]].upper
    merged = shard.changes(lower, upper if upper is not None else lower + 1)
    staged: StagedBatch = shard.stage(merged, lower=lower, upper=upper, desc_id=new_id)
    cmd = CompactCommand(new_id, tuple(ids), lower, upper, 0, staged.parts)
    out = shard._machine.commit(cmd, writer="test-compactor")
    assert isinstance(out, st.Version)
    return out


def keys(shard: Shard, prefix: str) -> set[str]:
    return {o.key for o in shard._machine.blob.list(prefix)}


def contents(shard: Shard) -> list[tuple[str, int]]:
    snap = shard.snapshot()
    return sorted(zip(snap["k"].to_pylist(), snap["_count"].to_pylist(), strict=True))
