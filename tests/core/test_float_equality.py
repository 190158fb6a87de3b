"""One float equality everywhere (issue 17 item 2; plugins/shardsink/core/floats.py).

``-0.0`` is ``0.0`` and every NaN (any sign, payload, quiet or signalling) is one NaN, in
staging, in every read (snapshot, changes), compaction and verify, wherever the rows of
an insert and its retraction fall. Checked against an independent model that keys rows by
the documented rule, on both backends.
"""

from __future__ import annotations

import struct
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsink import Shard, StagedBatch
from shardsink.core import floats as fl
from shardsink.core.part_io import write_parts
from shardsink.maintenance import CompactOptions, ScheduleOptions, compact
from shardsink.maintenance.verify import verify
from shardsink_dev.testing import MotoServer

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.float64()), ("y", pa.float32())])


def f64(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def bits64(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


#: Representations of a few values: the list's members are one row value each under the rule.
SPELLINGS: dict[str, list[float | None]] = {
    "zero": [0.0, -0.0],
    "nan": [f64(0x7FF8000000000000), f64(0xFFF8000000000000), f64(0x7FF8000000000123), f64(0x7FF0000000000001),
            f64(0xFFF4000000000000)],
    "inf": [float("inf")],
    "-inf": [float("-inf")],
    "one": [1.0],
    "null": [None],
}
NAMES = sorted(SPELLINGS)


def canonical_key(x: float | None) -> Any:
    """The model's row identity of a float: the documented rule, written independently."""
    if x is None:
        return None
    if x != x:
        return "nan"
    return 0.0 if x == 0.0 else x


def model_key(row: tuple[str, float | None, float | None]) -> tuple[Any, ...]:
    return (row[0], canonical_key(row[1]), canonical_key(row[2]))


def shard_counter(table: pa.Table) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for r in table.to_pylist():
        out[(r["k"], canonical_key(r["x"]), canonical_key(r["y"]))] += r["_count"]
    return out


@pytest.fixture(params=["local", "s3"])
def url_maker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if request.param == "local":
        root = tmp_path_factory.mktemp("floats")
        yield lambda: f"file://{root}/{uuid.uuid4().hex[:12]}"
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        assert moto
        yield lambda: f"s3://shardsink-test/floats-{uuid.uuid4().hex[:12]}"


def _table(rows: list[tuple[str, float | None, float | None, int, int]]) -> pa.Table:
    return pa.table({"k": [r[0] for r in rows], "x": pa.array([r[1] for r in rows], pa.float64()),
                     "y": pa.array([r[2] for r in rows], pa.float32()), "_time": [r[3] for r in rows],
                     "_diff": [r[4] for r in rows]})


def test_a_zero_and_its_negative_zero_retraction_in_other_batches_cancel(url_maker: Any) -> None:
    """The reported case: +1 of (9, 'f', 0.0) in one batch, -1 of (9, 'f', -0.0) in the next."""
    shard = Shard.create(url_maker(), SCHEMA)
    shard.append(_table([("f", 0.0, 9.0, 0, 1)]), lower=0, upper=10)
    shard.append(_table([("f", -0.0, 9.0, 10, -1)]), lower=10, upper=20)
    nan_a, nan_b = f64(0x7FF8000000000001), f64(0xFFF8000000000000)
    shard.append(_table([("g", nan_a, 1.0, 20, 1)]), lower=20, upper=30)
    shard.append(_table([("g", nan_b, 1.0, 30, -1)]), lower=30, upper=40)
    assert shard.snapshot().num_rows == 0
    assert shard.snapshot(15).num_rows == 0 and shard.snapshot(25).num_rows == 1
    assert verify(shard).ok
    compact(shard, options=CompactOptions(schedule=ScheduleOptions(fan_in=2)))
    assert shard.snapshot().num_rows == 0 and verify(shard).ok


def test_parts_store_canonical_bits(url_maker: Any) -> None:
    shard = Shard.create(url_maker(), SCHEMA)
    staged = shard.stage(_table([("a", -0.0, f64(0xFFF8000000000000), 1, 1),
                                 ("b", f64(0x7FF0000000000001), -0.0, 1, 1)]), lower=0, upper=10, desc_id="d")
    (part,) = staged.parts
    got = shard._machine.blob.get(part.key)
    assert got is not None
    t = pq.read_table(pa.BufferReader(got.data)).sort_by("k")
    assert [bits64(x) for x in t["x"].to_pylist()] == [0, fl.CANONICAL_NAN_BITS[64]]
    y = t["y"].cast(pa.float64()).to_pylist()
    assert y[1] == 0.0 and struct.pack("<f", y[1]) == b"\0\0\0\0"
    assert struct.unpack("<I", struct.pack("<f", y[0]))[0] == fl.CANONICAL_NAN_BITS[32]


def test_parts_written_before_the_rule_read_canonical(url_maker: Any) -> None:
    """A part holding -0.0 and a NaN payload (an older writer) consolidates like canonical ones."""
    shard = Shard.create(url_maker(), SCHEMA)
    raw = _table([("a", -0.0, 1.0, 0, 1), ("n", f64(0x7FF8000000000042), 1.0, 0, 1)])
    old = write_parts(shard._machine.blob, raw, prefix="parts/old")  # bypasses staging's canonicalisation
    shard.compare_and_append([StagedBatch("old", 0, 10, old)], expected_upper=0, new_upper=10, desc_id="old")
    shard.append(_table([("a", 0.0, 1.0, 10, -1), ("n", f64(0xFFF8000000000000), 1.0, 10, -1)]),
                 lower=10, upper=20)
    assert shard.snapshot(5).num_rows == 2
    assert shard.snapshot().num_rows == 0
    assert verify(shard).ok
    assert shard.changes(0, 20).num_rows == 4


UPDATE = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(NAMES), st.sampled_from(NAMES))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inserts=st.lists(UPDATE, min_size=1, max_size=8), seed=st.randoms(use_true_random=False),
       batches=st.integers(1, 4))
def test_every_read_agrees_with_the_model_however_rows_fall_into_batches(
        url_maker: Any, inserts: list[tuple[str, str, str]], seed: Any, batches: int) -> None:
    """Random inserts, each retracted (or not) in a *different spelling* of the same value,
    split across batches at random: snapshots at every time, the change feed, compaction
    and verify all agree with the model."""
    updates: list[tuple[str, float | None, float | None, int]] = []
    for k, xn, yn in inserts:
        updates.append((k, seed.choice(SPELLINGS[xn]), seed.choice(SPELLINGS[yn]), 1))
        if seed.random() < 0.7:
            updates.append((k, seed.choice(SPELLINGS[xn]), seed.choice(SPELLINGS[yn]), -1))
    # Batches in order; a retraction never lands before its insert (multiplicities stay >= 0).
    cuts = sorted(seed.sample(range(1, len(updates)), min(batches - 1, len(updates) - 1)))
    groups = [updates[a:b] for a, b in zip([0, *cuts], [*cuts, len(updates)], strict=True)]
    shard = Shard.create(url_maker(), SCHEMA)
    model: list[tuple[tuple[Any, ...], int, int]] = []
    for i, g in enumerate(groups):
        rows = [(k, x, None if y is None else float(y), 10 * i + 1, d) for k, x, y, d in g]
        shard.append(_table(rows), lower=10 * i, upper=10 * (i + 1))
        model += [(model_key((k, x, y)), 10 * i + 1, d) for k, x, y, _, d in rows]

    def expected(as_of: int) -> Counter[tuple[Any, ...]]:
        c: Counter[tuple[Any, ...]] = Counter()
        for key, t, d in model:
            if t <= as_of:
                c[key] += d
        return +c

    for i in range(len(groups)):
        assert shard_counter(shard.snapshot(10 * i + 5)) == expected(10 * i + 5)
    feed: Counter[tuple[Any, ...]] = Counter()
    for r in shard.changes(0, 10 * len(groups)).to_pylist():
        feed[(r["k"], canonical_key(r["x"]), canonical_key(r["y"]), r["_time"])] += r["_diff"]
    want: Counter[tuple[Any, ...]] = Counter()
    for key, t, d in model:
        want[(*key, t)] += d
    assert +feed == +want and -feed == -want
    assert verify(shard).ok
    compact(shard, options=CompactOptions(schedule=ScheduleOptions(fan_in=2)))
    assert shard_counter(shard.snapshot()) == expected(10 * len(groups))
    assert verify(shard).ok
