"""Concurrency and failure under real Airflow: a lost race, a killed write, a lost ack."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from af_helpers import DAY, START, Env, assert_exactly_once, assert_no_leaks, ok
from support.inject.faultpoints import fault_env

from shardsink import Shard
from shardsink.sources.landing import LandingSource, slot_of
from shardsink_dev.synthetic import generate


def _wait_for(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)  # a real Airflow run's progress, seen only in the store: polled, bounded


@pytest.mark.timeout(1800)  # run A stages two descriptions (two spark-submits) before B runs
def test_two_runs_race_loser_deletes_its_parts_and_its_next_description_still_commits(
        af: Env, tmp_path: Path, airflow_template: Path, connect_engine: dict[str, str]) -> None:
    """Run A (interval Jan 2, catching up at once) mints the chain [Jan 1, Jan 2), [Jan 2, Jan 3);
    run B (interval Jan 1) mints [Jan 1, Jan 2). A's appends are held until B has committed, so
    A's first description loses (its parts go) and its second, whose lower is now the shard's
    upper, commits in the same attempt. Both runs end green with their intervals covered.

    One writer slot per run: the race is between descriptions, not slots. The slots write over
    Spark Connect (a session each, no spark-submit; a killed spark-submit slot is the next test)."""
    af.env.update(connect_engine)
    generate(af.landing, start=START, days=2, files_per_day=2, rows_per_file=100)
    go = tmp_path / "go"
    faults = {"append_wait": {"attempt": 1, "until": str(go), "timeout": 600}}
    home_b = tmp_path / "ah-b"
    home_b.mkdir()
    shutil.copy(airflow_template, home_b / "airflow.db")

    log_a = tmp_path / "run-a.log"
    run_a = af.popen_dags_test("2024-01-03", log=log_a,
                               extra={**fault_env(faults, af.env), "SHARDSINK_CATCH_UP_AFTER_S": "0",
                                      "SHARDSINK_WRITERS": "1"})
    parts = Path(af.root / "shards" / "events" / "parts")
    staging = Path(af.root / "shards" / "events" / "staging")
    try:
        _wait_for(lambda: staging.is_dir() and len(list(staging.iterdir())) == 2, 1200,
                  "run A to stage both descriptions of its chain")
        a_descs = sorted(p.name for p in staging.iterdir())
        assert all("-a1-" in d for d in a_descs)
        ok(af.dags_test("2024-01-02", home=home_b, extra={"SHARDSINK_WRITERS": "1"}))
        assert Shard.open(af.shard_url).info().upper == START + DAY
        go.touch()
        run_a.wait(timeout=600)
    finally:
        go.touch()
        if run_a.poll() is None:
            run_a.kill()
    out_a = log_a.read_text()
    assert run_a.returncode == 0, out_a[-6000:]
    shard = Shard.open(af.shard_url)
    kept = {b.desc_id for b in shard.batches()}
    lost = [d for d in a_descs if d not in kept]
    assert len(lost) == 1 and len(set(a_descs) & kept) == 1, (a_descs, kept)
    assert f"lost the race at shard upper {START + DAY}: description {lost[0]}" in out_a
    assert not (parts / lost[0]).exists() or not any((parts / lost[0]).iterdir()), "loser's parts were not deleted"
    info = shard.info()
    assert info.upper == START + 2 * DAY and info.seqno == 2
    assert info.last_commit.desc_id in a_descs
    assert_exactly_once(af.shard_url, af.landing, START, START + 2 * DAY)
    assert_no_leaks(af.shard_url)
    assert [(e["lower"], e["upper"]) for e in af.asset_events()] == [(START + DAY, START + 2 * DAY)]
    assert [(e["lower"], e["upper"]) for e in af.asset_events(home_b)] == [(START, START + DAY)]


def test_killed_write_and_lost_ack_are_retried_without_duplicates(af: Env, tmp_path: Path) -> None:
    """One slot's spark-submit dies after uploading parts (before its manifest); the append
    commits but its answer is lost. Airflow retries both tasks; the shard holds the source
    exactly once and the killed attempt's parts are gone."""
    generate(af.landing, start=START, days=1, files_per_day=4, rows_per_file=100)
    slot = slot_of(LandingSource(af.landing).files()[0].key, 2)  # a slot that has files to stage
    faults = {"write_kill": {"slot": slot, "once": str(tmp_path / "killed")},
              "append_ack_lost": {"once": str(tmp_path / "ack-lost")}}
    out = ok(af.dags_test("2024-01-02", extra=fault_env(faults, af.env)))
    assert (tmp_path / "killed").exists() and (tmp_path / "ack-lost").exists()
    assert "SHARDSINK_FAULT write_kill" in out
    assert "injected fault: the acknowledgement" in out
    # The retry finds the commit its lost answer made: this run's (the shard log names its writer).
    assert "(by this run before this try: its turn trigger on the triggerer, or an earlier try)" in out
    assert "staged parts not in its committed batch" in out  # the killed attempt's leftovers
    info = Shard.open(af.shard_url).info()
    assert info.seqno == 1 and info.upper == START + DAY
    assert_exactly_once(af.shard_url, af.landing, START, START + DAY)
    assert_no_leaks(af.shard_url)
    events = af.asset_events()
    assert len(events) == 1 and events[0]["seqno"] == 1 and events[0]["rows"] == 400
