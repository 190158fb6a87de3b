"""Exactly-once across the fault matrix: crashes (real OS processes), lost acknowledgements
(S3 through the fault proxy), racing binders, backfills and replays. Every check counts ids
against the ids the test itself put into the source."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rc_helpers import (
    DAY,
    SCHEMA,
    START,
    assert_exactly_once,
    land,
    mint_desc,
    run_once,
    times_of,
    write_slots,
)
from support.faultproxy import FaultProxy, fault_proxy

from shardsink import Shard
from shardsink.reclock.remap import RemapShard
from shardsink.sinks.ingest import Description, LostRaceError, append_from_manifests
from shardsink.sources.files import FileArrivals
from shardsink.testing import MotoServer

HERE = Path(__file__).parent
BUCKET = "shardsink-test"  # the session bucket of tests/conftest.py


def proc_mint(shard_url: str, src: FileArrivals, end: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "proc_mint.py"), shard_url, json.dumps(src.spec()), str(end),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def test_crash_between_staging_and_append_then_a_fresh_run_commits_once(spark: Any, tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    ids = land(root, "1.parquet", range(30)) + land(root, "2.jsonl", range(30, 45))
    d = mint_desc(data, src, interval_end=START + DAY, run_id="crashed")
    assert isinstance(d, Description)
    write_slots(spark, Shard.open(data), src, d, slots=2)  # staged, manifests written; the run dies here
    fresh = run_once(spark, data, src, interval_end=START + DAY, run_id="fresh")  # metadata lost: a new run
    assert isinstance(fresh, Description) and fresh.desc_id != d.desc_id
    with pytest.raises(LostRaceError):  # the crashed run's append, if it ever comes back, loses and cleans up
        append_from_manifests(Shard.open(data), d, 2)
    assert_exactly_once(data, ids)
    shard = Shard.open(data)
    referenced = {p.key for b in shard.batches() for p in b.parts}
    assert not [o for o in shard.blob.list(f"parts/{d.desc_id}/")], "the loser's staged parts were deleted"
    assert referenced


def test_racing_binders_in_separate_processes_mint_one_binding(tmp_path: Path) -> None:
    root, data, src = setup(tmp_path)
    land(root, "0.parquet", range(5))
    Shard.create(data, SCHEMA, upper=START)
    go = tmp_path / "go"
    procs = [proc_mint(data, src, START + DAY, "--go", str(go)) for _ in range(4)]
    for i in range(3):  # files keep arriving while the binders list
        land(root, f"late-{i}.parquet", range(100 + 10 * i, 110 + 10 * i))
        if i == 0:
            go.touch()
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
