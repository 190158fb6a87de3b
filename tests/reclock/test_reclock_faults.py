"""Exactly-once across the fault matrix: crashes (real OS processes), lost acknowledgements
(S3 through the fault proxy), racing binders, backfills and replays. Every check counts ids
against the ids the test itself put into the source."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from threading import BrokenBarrierError
from typing import Any

import proc_run
import pytest
from rc_helpers import (
    DAY,
    SCHEMA,
    START,
    assert_exactly_once,
    assert_matches_source,
    assert_no_leaks,
    expect,
    kill_hard,
    land,
    run_once,
    source_id_counts,
    spawn_ctx,
    staged_objects,
    times_of,
)
from support.clock import await_line, release
from support.faultproxy import FaultProxy, fault_proxy

from shardsink import Shard
from shardsink.core.fate import DeleteRefusedError, delete_staged
from shardsink.reclock.remap import RemapShard
from shardsink.sinks.append import LostRaceError, append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sources.files import FileArrivals
from shardsink_dev.testing import MotoServer

HERE = Path(__file__).parent
BUCKET = "shardsink-test"  # the session bucket of tests/conftest.py


def proc_mint(shard_url: str, src: FileArrivals, end: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "proc_mint.py"), shard_url, json.dumps(src.spec()), str(end),
                             *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def setup(tmp_path: Path) -> tuple[str, str, FileArrivals]:
    root, data, remap = str(tmp_path / "landing"), (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    return root, data, FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)


def test_crash_between_binding_and_data_commit_resumes_with_the_same_binding(spark: Any, tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    ids = land(root, "1.parquet", range(20))
    p = proc_mint(data, src, START + DAY, "--die")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 137, err[-2000:]
    crashed = json.loads(out)
    assert RemapShard.open(src.remap_url).bindings().upper == START + DAY, "the binding is durable"
    ids += land(root, "2.csv", range(20, 30))  # arrives after the crash: must not join the bound range
    d = run_once(spark, data, src, interval_end=START + DAY)  # the retry of the crashed run
    assert isinstance(d, Description) and (d.lower, d.upper) == (crashed["lower"], crashed["upper"])
    assert set(times_of(data)) == set(range(20)), "the retry used the crashed run's binding, not a new listing"
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_exactly_once(data, ids)


def test_a_run_sigkilled_between_staging_and_append_leaves_a_fresh_run_exactly_once_and_no_orphans(
        spark: Any, tmp_path: Path) -> None:
    """A child OS process mints (binds), stages every slot's parts and manifests, and is
    SIGKILLed before append. Its description (what XCom would hold) survives it. While the
    orphan may still commit, the fate-checked deleter refuses to touch it; a fresh run
    commits the same records once; the killed run's append, retried, loses and removes the
    orphan's objects through the lost-race cleanup (core.fate.delete_staged)."""
    root, data, src = setup(tmp_path)
    land(root, "1.parquet", range(30))
    land(root, "2.jsonl", range(30, 45))
    Shard.create(data, SCHEMA, upper=START)
    ctx = spawn_ctx()
    out = ctx.Queue()
    child = ctx.Process(target=proc_run.stage_and_hang, args=(data, src.spec(), START + DAY, 2, out))
    child.start()
    try:
        (doc,) = expect(out, "staged")
    finally:
        kill_hard(child)
    orphan = Description.from_dict(doc)
    left = staged_objects(data, orphan.desc_id)
    assert len([k for k in left if k.startswith("staging/")]) == 2 and any(k.startswith("parts/") for k in left)
    with pytest.raises(DeleteRefusedError):  # it may still commit: nothing of it may go
        delete_staged(Shard.open(data)._machine, orphan.desc_id, orphan.lower)
    assert staged_objects(data, orphan.desc_id) == left
    land(root, "3.csv", range(45, 60))  # arrives after the crash: not in the crashed binding
    fresh = run_once(spark, data, src, interval_end=START + DAY, run_id="fresh")
    assert isinstance(fresh, Description) and fresh.desc_id != orphan.desc_id
    assert (fresh.lower, fresh.upper) == (orphan.lower, orphan.upper), "the fresh run reused the durable binding"
    assert set(times_of(data)) == set(range(45))
    with pytest.raises(LostRaceError) as lost:  # the killed run's append task, retried
        append_from_manifests(Shard.open(data), orphan, 2)
    assert lost.value.deleted == len(left) and staged_objects(data, orphan.desc_id) == []
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_matches_source(data, source_id_counts(root))
    assert_no_leaks(data)


def test_two_complete_runs_racing_in_two_processes_ingest_every_file_once_and_the_loser_leaks_nothing(
        tmp_path: Path) -> None:
    """Two OS processes, each with its own Spark, run mint -> write -> append for overlapping
    target times on the same data and remap shards for several rounds; a barrier releases each
    round and a second one makes both stage before either appends, so every round has one
    winner and one loser, which starts a fresh run. Files land between rounds (and one while
    the racers mint). Checked against the files read directly with pyarrow."""
    root, data, src = setup(tmp_path)
    Shard.create(data, SCHEMA, upper=START)
    rounds = 3
    ends = {"p0": [START + (r + 1) * DAY for r in range(rounds)],
            "p1": [START + (r + 1) * DAY + DAY // 2 for r in range(rounds)]}
    ctx = spawn_ctx()
    out, barrier = ctx.Queue(), ctx.Barrier(3)
    procs = [ctx.Process(target=proc_run.racer, args=(n, data, src.spec(), ends[n], 1, barrier, out))
             for n in ends]
    for p in procs:
        p.start()
    reports: list[tuple[Any, ...]] = []
    try:
        for r in range(rounds):
            land(root, f"r{r}-a.parquet", range(1000 * r, 1000 * r + 40))
            land(root, f"r{r}-b.csv", range(1000 * r + 40, 1000 * r + 55))
            barrier.wait(timeout=900)  # go
            if r < rounds - 1:  # races the listings; bound this round or the next
                land(root, f"r{r}-late.jsonl", range(1000 * r + 500, 1000 * r + 510))
            barrier.wait(timeout=900)  # both staged
            barrier.wait(timeout=900)  # both appended
            reports += [expect(out, "round") for _ in procs]
    except BrokenBarrierError:
        raise AssertionError(f"a racer failed: {out.get(timeout=60)}") from None
    finally:
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    firsts = {r: [events[0][0] for _, rr, events in reports if rr == r] for r in range(rounds)}
    assert all(sorted(f) == ["committed", "lost"] for f in firsts.values()), firsts
    losers = [e for _, _, events in reports for e in events if e[0] == "lost"]
    for _, desc_id, _, _, deleted in losers:
        assert isinstance(deleted, int) and deleted > 0
        assert staged_objects(data, desc_id) == [], f"loser {desc_id} leaked"
    assert_matches_source(data, source_id_counts(root))
    assert_no_leaks(data)
    assert_no_leaks(src.remap_url)  # racing binders discarded their losing binding parts


def test_racing_binders_in_separate_processes_mint_one_binding(tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    land(root, "0.parquet", range(5))
    Shard.create(data, SCHEMA, upper=START)
    procs = [proc_mint(data, src, START + DAY, "--go") for _ in range(4)]
    for i in range(3):  # files keep arriving while the binders list
        land(root, f"late-{i}.parquet", range(100 + 10 * i, 110 + 10 * i))
        if i == 0:
            for p in procs:
                await_line(p, "ready")
            for p in procs:
                release(p)
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    assert {(o["lower"], o["upper"]) for o in outs} == {(START, START + DAY)}
    b = RemapShard.open(src.remap_url).bindings()
    assert [x.time for x in b.history] == [START + DAY - 1], "one binding for the time, whoever won"
    keys = [f.key for f in b.history[0].files]
    assert len(keys) == len(set(keys)) and "0.parquet" in keys
    assert [f.ordinal for f in b.history[0].files] == list(range(len(keys)))


def test_backfill_over_several_intervals_and_a_replay_assign_the_same_times(spark: Any, tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    ids: list[int] = []
    for day in range(1, 5):
        ids += land(root, f"d{day}.parquet", range(100 * day, 100 * day + 25))
        run_once(spark, data, src, interval_end=START + day * DAY)
    assert_exactly_once(data, ids)
    first = times_of(data)
    assert sorted(set(first.values())) == [START + d * DAY - 1 for d in range(1, 5)]
    # A replay into a new output shard from the same remap shard: same rows, same times.
    replay = (tmp_path / "replay").as_uri()
    for day in range(1, 5):
        run_once(spark, replay, src, interval_end=START + day * DAY)
    assert times_of(replay) == first
    # Re-running the backfill's intervals changes nothing.
    for day in range(1, 5):
        run_once(spark, data, src, interval_end=START + day * DAY)
    assert times_of(data) == first and Shard.open(data).info().seqno == 4


# --- lost acknowledgements on S3 ------------------------------------------------------------


@pytest.fixture
def proxy(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """Every S3 request of this process goes through the fault proxy."""
    with fault_proxy(moto.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        yield p


@pytest.mark.parametrize("which", ["data", "remap"])
def test_lost_acknowledgement_of_a_commit_is_resolved_and_ingests_once(
        spark: Any, tmp_path: Path, proxy: FaultProxy, which: str) -> None:
    import uuid

    prefix = f"lostack-{uuid.uuid4().hex[:8]}"
    data, remap = f"s3://{BUCKET}/{prefix}/events", f"s3://{BUCKET}/{prefix}/remap"
    root = str(tmp_path / "landing")
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    ids = land(root, "1.parquet", range(40))
    Shard.create(data, SCHEMA, upper=START)
    RemapShard.open_or_create(remap, initial_upper=START)
    target = rf"{prefix}/{'events' if which == 'data' else 'remap'}/state/v/00000000000000000001\.json$"
    proxy.add("drop_response_after_forward", method="PUT", key=target, header="If-None-Match")
    run_once(spark, data, src, interval_end=START + DAY)
    assert [r.upstream_status for r in proxy.requests("PUT", target)] == [200], "applied once, answer dropped"
    proxy.clear_rules()
    ids += land(root, "2.parquet", range(40, 50))
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_exactly_once(data, ids)
    assert [x.time for x in RemapShard.open(remap).bindings().history] == [START + DAY - 1, START + 2 * DAY - 1]


def test_a_description_spanning_bindings_of_crashed_runs_stamps_each_record_with_its_own_binding(
        spark: Any, tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    ids = land(root, "1.parquet", range(10))
    for day in (1, 2):  # two runs bind and crash before writing anything
        p = proc_mint(data, src, START + day * DAY, "--die")
        p.communicate(timeout=120)
        assert p.returncode == 137
        if day == 1:
            ids += land(root, "2.parquet", range(10, 20))
    d = run_once(spark, data, src, interval_end=START + 2 * DAY)  # one description over both bindings
    assert isinstance(d, Description) and (d.lower, d.upper) == (START, START + 2 * DAY)
    t = times_of(data)
    assert {t[i] for i in range(10)} == {START + DAY - 1} and {t[i] for i in range(10, 20)} == {START + 2 * DAY - 1}
    assert_exactly_once(data, ids)
