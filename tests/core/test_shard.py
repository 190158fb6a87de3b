"""The Shard contract (create, append, commit, read, log, discard) on both backends,
checked against a plain Python model of the data: a Counter of updates."""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest

from shardsink import (
    CorruptionError,
    InvalidUsageError,
    ReadFrontierError,
    Shard,
    ShardClosedError,
    ShardExistsError,
    ShardNotFoundError,
    UpperMismatchError,
)
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.machine import ROLLUP_EVERY
from shardsink.storage import Blob
from shardsink.storage.s3 import S3Blob

BUCKET = "shardsink-test"  # created by the session `moto` fixture in tests/conftest.py
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
Update = tuple[str | None, int | None, int, int]  # (k, v, time, diff)




def updates(rows: Iterable[Update]) -> pa.Table:
    ks, vs, ts, ds = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table(
        {"k": pa.array(ks, pa.string()), "v": pa.array(vs, pa.int64()), "_time": pa.array(ts, pa.int64()),
         "_diff": pa.array(ds, pa.int64())}
    )


def part_keys(blob: Blob) -> list[str]:
    return sorted(o.key for o in blob.list("parts/"))


def model_snapshot(model: Iterable[Update], as_of: int) -> Counter[tuple[Any, Any]]:
    c: Counter[tuple[Any, Any]] = Counter()
    for k, v, t, d in model:
        if t <= as_of:
            c[(k, v)] += d
    return Counter({row: n for row, n in c.items() if n != 0})


def model_changes(model: Iterable[Update], lower: int, upper: int) -> dict[tuple[Any, Any, int], int]:
    c: Counter[tuple[Any, Any, int]] = Counter()
    for k, v, t, d in model:
        if lower <= t < upper:
            c[(k, v, t)] += d
    return {key: n for key, n in c.items() if n != 0}


def snap(table: pa.Table) -> Counter[tuple[Any, Any]]:
    assert table.column_names == ["k", "v", "_count"]
    rows = [(r["k"], r["v"]) for r in table.to_pylist()]
    assert len(rows) == len(set(rows)), "snapshot rows must be distinct"
    return Counter({(r["k"], r["v"]): r["_count"] for r in table.to_pylist()})


def changes(table: pa.Table) -> dict[tuple[Any, Any, int], int]:
    assert table.column_names == ["k", "v", "_time", "_diff"]
    out = {(r["k"], r["v"], r["_time"]): r["_diff"] for r in table.to_pylist()}
    assert len(out) == table.num_rows, "changes must be consolidated per (row, time)"
    assert 0 not in out.values()
    return out


def random_batch(rng: random.Random, present: Counter[tuple[Any, Any]], lower: int, upper: int) -> list[Update]:
    """Inserts (with duplicates) and retractions of rows present before ``lower`` (never negative)."""
    out: list[Update] = []
    budget = Counter(present)
    for _ in range(rng.randint(0, 12)):
        t = rng.randrange(lower, upper)
        live = [r for r, n in budget.items() if n > 0]
        if live and rng.random() < 0.3:
            row = rng.choice(live)
            budget[row] -= 1
            out.append((row[0], row[1], t, -1))
        else:
            k = rng.choice(["a", "b", "c", None])
            out.append((k, rng.choice([1, 2, None]), t, rng.choice([1, 1, 2])))
    return out


# --- create / open -------------------------------------------------------------------


def test_create_then_open_reports_seqno_0_the_upper_and_the_schema(shard_url: str, blob: Blob) -> None:
    Shard.create(shard_url, SCHEMA, upper=100, writer="me", blob=blob)
    info = Shard.open(shard_url, blob=blob).info()
    assert (info.seqno, info.upper, info.since, info.stats) == (0, 100, 0, st.Stats())
    assert info.schema.equals(SCHEMA)
    assert (info.last_commit.kind, info.last_commit.writer) == ("create", "me")


def test_open_of_a_nonexistent_shard_raises_shard_not_found(shard_url: str, blob: Blob) -> None:
    with pytest.raises(ShardNotFoundError, match="no shard at"):
        Shard.open(shard_url, blob=blob)
    assert list(blob.list("")) == []


def test_create_twice_raises_shard_exists_and_leaves_the_shard_unchanged(shard_url: str, blob: Blob) -> None:
    Shard.create(shard_url, SCHEMA, upper=5, blob=blob)
    other = pa.schema([("x", pa.float64())])
    with pytest.raises(ShardExistsError, match="already exists"):
        Shard.create(shard_url, other, upper=7, blob=blob)
    info = Shard.open(shard_url, blob=blob).info()
    assert (info.seqno, info.upper) == (0, 5)
    assert info.schema.equals(SCHEMA)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (pa.schema([]), "no user columns"),
        (pa.schema([("a", pa.int64()), ("a", pa.string())]), r"duplicate column names \['a'\]"),
        (pa.schema([("a", pa.list_(pa.int64()))]), "unsupported types"),
        (pa.schema([("a", pa.int64()), ("_time", pa.int64())]), r"reserved column names \['_time'\]"),
        (pa.schema([("_diff", pa.int64())]), r"reserved column names \['_diff'\]"),
        (pa.schema([("_count", pa.int64())]), r"reserved column names \['_count'\]"),
        (pa.schema([("a", pa.int64()), ("_Time", pa.int64())]), r"reserved column names \['_Time'\]"),
        (pa.schema([("id", pa.int64()), ("ID", pa.string())]), "has columns 'id' and 'ID', equal ignoring case"),
    ],
)
def test_create_refuses_unusable_schemas_and_writes_nothing(
    shard_url: str, blob: Blob, schema: pa.Schema, message: str
) -> None:
    with pytest.raises(InvalidUsageError, match=message):
        Shard.create(shard_url, schema, blob=blob)
    assert list(blob.list("")) == []


@pytest.mark.parametrize("upper", [-1, True, "5", None])
def test_create_refuses_an_invalid_initial_upper_naming_it(shard_url: str, blob: Blob, upper: Any) -> None:
    with pytest.raises(InvalidUsageError, match=f"initial upper {upper!r}"):
        Shard.create(shard_url, SCHEMA, upper=upper, blob=blob)
    assert list(blob.list("")) == []


# --- append and read, against the model -----------------------------------------------------


def test_appends_snapshots_and_changes_match_a_counter_model(shard_url: str, blob: Blob) -> None:
    rng = random.Random(7)
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model: list[Update] = []
    bounds = [0, 10, 15, 30, 31, 50]
    for lower, upper in itertools.pairwise(bounds):
        batch = random_batch(rng, model_snapshot(model, lower - 1), lower, upper)
        r = shard.append(updates(batch), lower=lower, upper=upper)
        assert r.status == "committed"
        model += batch
    reader = Shard.open(shard_url, blob=blob)  # a fresh handle: nothing cached
    for as_of in [0, 5, 9, 10, 14, 29, 30, 31, 49]:
        assert snap(reader.snapshot(as_of)) == model_snapshot(model, as_of), as_of
    assert snap(reader.snapshot()) == model_snapshot(model, 49)
    for lo, hi in [(0, 50), (0, 0), (5, 12), (10, 15), (30, 31), (31, 50)]:
        assert changes(reader.changes(lo, hi)) == model_changes(model, lo, hi), (lo, hi)


def test_append_result_reports_status_seqno_bounds_and_rows(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    r = shard.append(updates([("a", 1, 0, 1), ("a", 1, 0, 1), ("b", 2, 3, 1)]), lower=0, upper=10, desc_id="d1")
    assert (r.status, r.desc_id, r.seqno, r.lower, r.upper, r.rows) == ("committed", "d1", 1, 0, 10, 2)
    info = shard.info()
    assert (info.seqno, info.upper, info.stats.batches, info.stats.parts, info.stats.rows) == (1, 10, 1, 1, 2)


def test_append_without_diff_column_inserts_each_row_once(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(pa.table({"k": ["a", "a", "b"], "v": [1, 1, 2], "_time": [0, 1, 2]}), lower=0, upper=3)
    assert snap(shard.snapshot()) == Counter({("a", 1): 2, ("b", 2): 1})


def test_duplicate_rows_are_summed_and_cancelling_updates_leave_no_row(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(
        updates([("a", 1, 1, 1), ("a", 1, 1, 1), ("a", 1, 2, 3), ("b", 2, 1, 1), ("b", 2, 4, -1), ("c", 3, 4, 1),
                 ("c", 3, 4, -1)]),
        lower=0,
        upper=10,
    )
    shard.append(updates([("a", 1, 12, -5)]), lower=10, upper=20)
    assert snap(shard.snapshot(1)) == Counter({("a", 1): 2, ("b", 2): 1})
    assert snap(shard.snapshot(9)) == Counter({("a", 1): 5})
    assert snap(shard.snapshot()) == Counter()
    assert shard.snapshot().num_rows == 0
    # the same row, cancelled at the same time, leaves no update at all
    assert changes(shard.changes(4, 5)) == {("b", 2, 4): -1}


def test_negative_multiplicity_is_reported_as_corruption_naming_the_row(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(updates([("a", 1, 0, 1)]), lower=0, upper=5)
    shard.append(updates([("ghost", 9, 6, -1)]), lower=5, upper=10)
    assert snap(shard.snapshot(4)) == Counter({("a", 1): 1})  # before the bad update: fine
    with pytest.raises(CorruptionError, match=r"negative multiplicity as of 9.*ghost"):
        shard.snapshot(9)


def test_staged_parts_are_invisible_until_committed(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=10, blob=blob)
    staged = shard.stage(updates([("a", 1, 10, 1)]), lower=10, upper=20, desc_id="d1")
    assert len(part_keys(blob)) == 1
    assert all(k.startswith("parts/d1/") for k in part_keys(blob))
    assert shard.info().upper == 10 and shard.info().seqno == 0
    assert snap(shard.snapshot(9)) == Counter()
    shard.compare_and_append([staged], expected_upper=10, new_upper=20, desc_id="d1")
    assert snap(shard.snapshot()) == Counter({("a", 1): 1})


# --- idempotency and races --------------------------------------------------------------------


def test_retry_with_a_seen_desc_id_is_already_committed_and_writes_no_parts(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    batch = updates([("a", 1, 0, 1), ("b", 2, 5, 1)])
    first = shard.append(batch, lower=0, upper=10, desc_id="run-2024-01-01")
    shard.append(updates([("c", 3, 10, 1)]), lower=10, upper=20, desc_id="run-2024-01-02")
    before = part_keys(blob)
    again = Shard.open(shard_url, blob=blob).append(batch, lower=0, upper=10, desc_id="run-2024-01-01")
    assert (again.status, again.seqno) == ("already_committed", first.seqno)
    assert again.rows == first.rows == 2  # what the earlier attempt committed
    assert part_keys(blob) == before
    info = shard.info()
    assert (info.seqno, info.upper, info.stats.rows) == (2, 20, 3)
    assert snap(shard.snapshot()) == Counter({("a", 1): 1, ("b", 2): 1, ("c", 3): 1})


def test_retry_after_lost_ack_is_already_committed_and_discard_removes_only_the_retry_parts(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    batch = updates([("a", 1, 0, 1)])
    first = shard.stage(batch, lower=0, upper=10, desc_id="d1")
    shard.compare_and_append([first], expected_upper=0, new_upper=10, desc_id="d1")
    committed = part_keys(blob)
    # The writer never saw the acknowledgement: it stages again and commits again.
    retry = shard.stage(batch, lower=0, upper=10, desc_id="d1")
    r = shard.compare_and_append([retry], expected_upper=0, new_upper=10, desc_id="d1")
    assert (r.status, r.seqno) == ("already_committed", 1)
    assert shard.discard([retry]) == 1
    assert part_keys(blob) == committed
    assert snap(shard.snapshot()) == Counter({("a", 1): 1})


def test_very_late_retry_outside_the_recent_window_is_already_committed(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/late"
    shard = Shard.create(url, SCHEMA)
    batch = updates([("a", 1, 0, 1)])
    shard.append(batch, lower=0, upper=1, desc_id="early")
    empty = updates([])
    for i in range(1, tr.RECENT_DESCS + 2):
        shard.append(empty, lower=i, upper=i + 1, desc_id=f"later-{i}")
    assert shard._machine.head().version.header.committed_seqno("early") is None
    before = part_keys(shard._machine.blob)
    r = Shard.open(url).append(batch, lower=0, upper=1, desc_id="early")
    assert (r.status, r.seqno) == ("already_committed", 1)
    assert part_keys(shard._machine.blob) == before
    assert snap(shard.snapshot()) == Counter({("a", 1): 1})


def test_upper_mismatch_raises_with_current_upper_deletes_staged_parts_and_changes_nothing(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(updates([("a", 1, 0, 1)]), lower=0, upper=10)
    before = (shard.info().seqno, shard.info().upper, part_keys(blob))
    loser = Shard.open(shard_url, blob=blob)
    for lower, upper in [(0, 10), (0, 20), (5, 20), (11, 20)]:
        with pytest.raises(UpperMismatchError, match="current upper 10") as e:
            loser.append(updates([("b", 2, lower, 1)]), lower=lower, upper=upper, desc_id=f"lost-{lower}-{upper}")
        assert (e.value.current, e.value.expected) == (10, lower)
        assert e.value.exit_code == 3
    assert (shard.info().seqno, shard.info().upper, part_keys(blob)) == before
    assert snap(shard.snapshot()) == Counter({("a", 1): 1})


def test_compare_and_append_mismatch_leaves_staged_parts_for_discard(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=10, blob=blob)
    staged = shard.stage(updates([("a", 1, 0, 1), ("b", 1, 1, 1)]), lower=0, upper=10, desc_id="d1")
    assert len(part_keys(blob)) == 1
    with pytest.raises(UpperMismatchError) as e:
        shard.compare_and_append([staged], expected_upper=0, new_upper=10, desc_id="d1")
    assert e.value.current == 10
    assert len(part_keys(blob)) == 1
    assert shard.discard([staged]) == 1
    assert part_keys(blob) == []
    assert shard.info().seqno == 0


def test_compare_and_append_refuses_staged_batches_of_another_description(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    staged = shard.stage(updates([("a", 1, 0, 1)]), lower=0, upper=10, desc_id="d1")
    with pytest.raises(InvalidUsageError, match="does not belong"):
        shard.compare_and_append([staged], expected_upper=0, new_upper=10, desc_id="d2")
    with pytest.raises(InvalidUsageError, match="does not belong"):
        shard.compare_and_append([staged], expected_upper=0, new_upper=20, desc_id="d1")
    assert shard.info().seqno == 0


def test_discard_never_deletes_parts_referenced_by_a_committed_batch(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    staged = shard.stage(updates([("a", 1, 0, 1)]), lower=0, upper=10, desc_id="d")
    shard.compare_and_append([staged], expected_upper=0, new_upper=10, desc_id="d")
    keys = part_keys(blob)
    # e.g. a writer that saw an error after its commit actually landed cleans up "its" parts
    assert Shard.open(shard_url, blob=blob).discard([staged]) == 0
    assert part_keys(blob) == keys == [p.key for p in staged.parts]
    assert snap(shard.snapshot()) == Counter({("a", 1): 1})


def test_empty_batch_advances_the_upper_without_parts(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    r = shard.append(updates([]), lower=0, upper=1000, desc_id="nothing-new")
    assert (r.status, r.seqno, r.rows) == ("committed", 1, 0)
    info = shard.info()
    assert (info.upper, info.stats.batches, info.stats.parts) == (1000, 0, 0)
    assert part_keys(blob) == []
    assert shard.snapshot().num_rows == 0
    assert shard.append(updates([]), lower=0, upper=1000, desc_id="nothing-new").status == "already_committed"


# --- close ---------------------------------------------------------------------------------------


def test_closed_shard_refuses_appends_and_snapshot_without_as_of(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(updates([("a", 1, 3, 1)]), lower=0, upper=10)
    with pytest.raises(UpperMismatchError):
        shard.close(expected_upper=5)
    r = shard.close(expected_upper=10, desc_id="the-end")
    assert (r.status, r.upper) == ("committed", None)
    assert shard.close(expected_upper=10, desc_id="the-end").status == "already_committed"
    info = Shard.open(shard_url, blob=blob).info()
    assert (info.upper, info.seqno, info.last_commit.kind) == (None, 2, "close")
    parts = part_keys(blob)
    for lower, upper in [(10, 20), (0, 10), (10, None)]:
        with pytest.raises(ShardClosedError, match="closed"):
            shard.append(updates([("b", 2, lower, 1)]), lower=lower, upper=upper)
    with pytest.raises(ShardClosedError):
        shard.close(expected_upper=10)
    assert part_keys(blob) == parts
    assert shard.info().seqno == 2
    # Refused before staging: nothing was even written and deleted.
    assert not [o for o in blob.list("parts/") if o.key not in parts]
    with pytest.raises(ShardClosedError, match="closed"):
        shard.append(updates([("b", 2, 99, 1)]), lower=10**6, upper=10**6 + 1)
    with pytest.raises(ReadFrontierError, match="closed; pass an explicit as_of"):
        shard.snapshot()
    assert snap(shard.snapshot(3)) == Counter({("a", 1): 1})
    assert snap(shard.snapshot(10**12)) == Counter({("a", 1): 1})
    assert changes(shard.changes(0, 10**12)) == {("a", 1, 3): 1}


# --- read frontiers -------------------------------------------------------------------------------


def test_snapshot_and_changes_outside_since_and_upper_raise_read_frontier(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(updates([("a", 1, 3, 1)]), lower=0, upper=10)
    for as_of in [10, 11, 10**12]:
        with pytest.raises(ReadFrontierError, match=rf"as_of {as_of} is not readable.*upper \(10\)"):
            shard.snapshot(as_of)
    with pytest.raises(ReadFrontierError, match=r"as_of -1 .*since \(0\)"):
        shard.snapshot(-1)
    with pytest.raises(ReadFrontierError, match="beyond upper 10"):
        shard.changes(0, 11)
    with pytest.raises(ReadFrontierError, match="before since 0"):
        shard.changes(-1, 5)
    with pytest.raises(InvalidUsageError, match="reversed"):
        shard.changes(5, 4)
    assert snap(shard.snapshot(9)) == snap(shard.snapshot()) == Counter({("a", 1): 1})
    assert changes(shard.changes(0, 10)) == {("a", 1, 3): 1}


def test_snapshot_of_a_new_shard_with_an_initial_upper_is_empty(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=100, blob=blob)
    assert snap(shard.snapshot()) == Counter()
    assert changes(shard.changes(0, 100)) == {}


def test_new_shard_at_upper_0_has_nothing_readable_yet(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    with pytest.raises(ReadFrontierError, match=r"as_of -1"):
        shard.snapshot()
    assert changes(shard.changes(0, 0)) == {}


# --- long histories, log -----------------------------------------------------------------------------


def test_shard_with_more_than_32_commits_writes_a_rollup_and_reads_like_the_model(shard_url: str, blob: Blob) -> None:
    rng = random.Random(32)
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model: list[Update] = []
    n = ROLLUP_EVERY + 4
    for i in range(n):
        batch = random_batch(rng, model_snapshot(model, 10 * i - 1), 10 * i, 10 * i + 10)[:4]
        shard.append(updates(batch), lower=10 * i, upper=10 * i + 10, desc_id=f"d{i}")
        model += batch
    rollups = [o.key for o in blob.list("state/rollup/")]
    assert rollups == [f"state/rollup/{ROLLUP_EVERY:020d}.json"]
    reader = Shard.open(shard_url, blob=blob)
    info = reader.info()
    assert (info.seqno, info.upper, info.rollup) == (n, 10 * n, ROLLUP_EVERY)
    assert info.stats.batches == len(reader.batches()) == sum(1 for b in reader.batches() if b.parts)
    for as_of in [0, 155, 10 * ROLLUP_EVERY - 1, 10 * ROLLUP_EVERY, 10 * n - 1]:
        assert snap(reader.snapshot(as_of)) == model_snapshot(model, as_of), as_of
    assert changes(reader.changes(0, 10 * n)) == model_changes(model, 0, 10 * n)
    assert [s for s, _ in reader.log(limit=3)] == [n, n - 1, n - 2]


def test_log_lists_commits_newest_first_with_limit(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, writer="creator", blob=blob)
    shard.append(updates([("a", 1, 0, 1)]), lower=0, upper=10, desc_id="d1", writer="alice")
    shard.append(updates([("b", 1, 10, 1), ("c", 1, 11, 1)]), lower=10, upper=20, desc_id="d2", writer="bob")
    shard.close(expected_upper=20, desc_id="d3", writer="carol")
    log = Shard.open(shard_url, blob=blob).log()
    assert [(s, c.kind, c.batch(), c.writer) for s, c in log] == [
        (3, "close", ("d3", 20, None, 0), "carol"),
        (2, "append", ("d2", 10, 20, 2), "bob"),
        (1, "append", ("d1", 0, 10, 1), "alice"),
        (0, "create", None, "creator"),
    ]
    assert [c.sealed() for _, c in log] == [(20, 2**63), (10, 20), (0, 10), (-(2**63), 0)]
    assert all(c.at for _, c in log)
    assert [s for s, _ in shard.log(limit=2)] == [3, 2]
    assert [s for s, _ in shard.log(limit=100)] == [3, 2, 1, 0]
    with pytest.raises(InvalidUsageError, match="at least 1"):
        shard.log(limit=0)


# --- commit cost ----------------------------------------------------------------------------------------


def test_uncontended_commit_on_s3_makes_2_requests_after_open_and_4_with_it_whatever_the_history(
        s3_client: Any) -> None:
    prefix = f"commit-cost-{uuid.uuid4().hex[:8]}"
    url = f"s3://{BUCKET}/{prefix}"
    Shard.create(url, SCHEMA, blob=S3Blob(BUCKET, prefix, client=s3_client))
    for i in range(0, 12, 2):
        stager = Shard.open(url, blob=S3Blob(BUCKET, prefix, client=s3_client))
        staged = stager.stage(updates([("a", i, i, 1)]), lower=i, upper=i + 1, desc_id=f"d{i}")
        raw = S3Blob(BUCKET, prefix, client=s3_client)
        # An Airflow task: open (reads the head: hint + probe), then commit from what it read
        # (create the next version, CAS the hint).
        fresh = Shard.open(url, blob=raw)
        opened = raw.requests
        r = fresh.compare_and_append([staged], expected_upper=i, new_upper=i + 1, desc_id=f"d{i}")
        assert r.status == "committed"
        assert (opened, raw.requests - opened) == (2, 2), f"commit {i}: open {opened}, commit {raw.requests - opened}"
        # The same handle again, moments later: it starts from the head it committed.
        staged = fresh.stage(updates([("a", i + 1, i + 1, 1)]), lower=i + 1, upper=i + 2, desc_id=f"d{i + 1}")
        before = raw.requests
        r = fresh.compare_and_append([staged], expected_upper=i + 1, new_upper=i + 2, desc_id=f"d{i + 1}")
        assert r.status == "committed"
        assert raw.requests - before == 2, f"warm commit {i + 1} made {raw.requests - before} requests"
