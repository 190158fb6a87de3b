"""Backfills as Airflow users drive them, on ONE real scheduler serving three DAGs at once
(scheduler + dag-processor + api-server started by the test, :func:`af_helpers.airflow_stack`).

* ``bf_default``: a 5-day backfill at Airflow's default concurrency (max active runs 10);
* ``bf_backwards``: a 3-day ``--run-backwards`` backfill with ONE active run (the newest
  day runs first: its earlier days' runs cannot start until it ends, so it must catch up);
* ``bf_mixed``: a 3-day backfill (2 active runs) while manually triggered runs for days of
  the same range and the DAG's own latest scheduled run race it.

Every run must end green, each shard must hold its source exactly once with its upper at
the last interval's end, and each commit must be answerable: the commit log's writer names
exactly one run, and that run's ``report`` XCom lists exactly its commits.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import textwrap
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from af_helpers import (
    DAY,
    START,
    VENV_BIN,
    Env,
    airflow_stack,
    assert_exactly_once,
    assert_no_leaks,
    ok,
)

from shardsink import Shard
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev.synthetic import encode, generate, land_file, landing_table, publish_watermark
from shardsink_dev.testing import free_port

#: dag id -> (days of data, catch-up patience in seconds, DAG end date or None). An end date
#: keeps the scheduler from adding its own latest run (only bf_mixed gets one, on purpose).
SCENARIOS = {"bf_default": (5, 600, "2024-01-06"), "bf_backwards": (3, 20, "2024-01-04"),
             "bf_mixed": (3, 600, None)}

DAG_FILE = '''
"""Three backfill scenarios' DAGs (written by tests/airflow/test_backfill_concurrency.py)."""
import json, os
from datetime import UTC, datetime, timedelta
from shardsink.airflow import ingest_dag
from shardsink.sources import LandingSource

for dag_id, spec in json.loads(os.environ["BF_SCENARIOS"]).items():
    globals()[dag_id] = ingest_dag(
        dag_id=dag_id, shard_url=spec["shard"], source=LandingSource(spec["landing"], time_column="event_time"),
        writers=1, schedule="@daily", start_date=datetime(2024, 1, 1, tzinfo=UTC), max_span=timedelta(days=1),
        retry_backoff=0.5, task_retries=2, task_retry_delay=timedelta(seconds=2),
        catch_up_after=timedelta(seconds=spec["patience"]), poke_interval=timedelta(seconds=10),
        end_date=datetime.fromisoformat(spec["end"]).replace(tzinfo=UTC) if spec["end"] else None,
    )
'''


def _cli(env: dict[str, str], *args: str, ok_if: str = "\0") -> None:
    """An airflow CLI call, retried while SQLite is locked by the running scheduler."""
    for _ in range(10):
        r = subprocess.run([str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=180)
        if r.returncode == 0 or ok_if in r.stdout + r.stderr:
            return
        if "database is locked" not in r.stdout + r.stderr:
            break
        time.sleep(3)
    ok(r)


def _runs(env: dict[str, str], dag_id: str) -> list[dict[str, Any]]:
    """The DAG's runs (``run_id``, ``state``), read from the metadata DB.

    Not ``airflow dags list-runs``: each CLI call is a whole Airflow process (seconds of CPU),
    and the waits poll three DAGs every few seconds for minutes. A locked DB reads as no runs yet.
    """
    try:
        with closing(sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db", timeout=10)) as c:
            rows = c.execute("SELECT run_id, state FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    except sqlite3.OperationalError:
        return []
    return [{"run_id": run_id, "state": state} for run_id, state in rows]


def _reports(home: Path, dag_id: str) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(home / "airflow.db") as c:
        rows = c.execute("SELECT dr.run_id, x.value FROM xcom x JOIN dag_run dr ON dr.id = x.dag_run_id "
                         "WHERE x.dag_id = ? AND x.task_id = 'report' AND x.key = 'return_value'", (dag_id,)).fetchall()
    return {run: json.loads(v) if isinstance(v, (str, bytes)) else v for run, v in rows}


@pytest.mark.timeout(3600)  # one scheduler, three DAGs, ~11 Spark jobs on 2 shared cores
def test_backfills_at_any_concurrency_cover_every_interval_exactly_once(af: Env, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "bf_dags.py").write_text(textwrap.dedent(DAG_FILE))
    spec = {}
    for dag_id, (days, patience, end) in SCENARIOS.items():
        landing = str(af.root / dag_id / "landing")
        generate(landing, start=START, days=days, files_per_day=2, rows_per_file=50, seed=len(dag_id))
        spec[dag_id] = {"landing": landing, "shard": (af.root / dag_id / "shard").as_uri(), "patience": patience,
                         "end": end}
    port = free_port()
    env = {**af.env, "_API_PORT": str(port), "BF_SCENARIOS": json.dumps(spec),
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__PARALLELISM": "3",  # 2 cores: runs queue; the guarantee must not depend on it
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",
           "AIRFLOW__API_AUTH__JWT_SECRET": "shardsink-test-jwt-secret-not-for-production",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
    ok(subprocess.run([str(VENV_BIN / "airflow"), "dags", "reserialize"], env=env, capture_output=True, text=True,
                      timeout=180))
    # Created before the scheduler starts: SQLite is then not locked by it. The scheduler
    # runs them all at once, plus bf_mixed's own latest scheduled run.
    def backfill(dag_id: str, *extra: str) -> None:
        days = SCENARIOS[dag_id][0]
        _cli(env, "backfill", "create", "--dag-id", dag_id, "--from-date", "2024-01-01",
             "--to-date", f"2024-01-0{days}", *extra, ok_if="AlreadyRunningBackfill")

    backfill("bf_default")  # Airflow's default: 10 active runs
    backfill("bf_backwards", "--run-backwards", "--max-active-runs", "1")
    backfill("bf_mixed", "--max-active-runs", "2")
    for day in ("2024-01-03", "2024-01-02"):  # manual runs (noon: own logical dates) inside the range
        _cli(env, "dags", "trigger", "bf_mixed", "--logical-date", f"{day}T12:00:00+00:00",
             "--run-id", f"manual__{day}", ok_if="already exists")
    t0 = time.monotonic()
    with airflow_stack(env):
        deadline = time.monotonic() + 3000
        while True:
            runs = {d: _runs(env, d) for d in SCENARIOS}
            pending = {d: sorted(r["state"] for r in rs if r["state"] not in ("success", "failed"))
                       for d, rs in runs.items()}
            enough = all(len([r for r in rs if r["run_id"].startswith("backfill__")]) >= SCENARIOS[d][0]
                         for d, rs in runs.items())
            if enough and not any(pending.values()):
                break
            assert time.monotonic() < deadline, f"runs did not finish: {pending}"
            time.sleep(2)
    print(f"all scenarios finished in {time.monotonic() - t0:.0f}s")
    for dag_id, (days, _, _) in SCENARIOS.items():
        states = {r["run_id"]: r["state"] for r in runs[dag_id]}
        assert set(states.values()) == {"success"}, (dag_id, states)
        url = spec[dag_id]["shard"]
        shard = Shard.open(url)
        assert shard.info().upper == START + days * DAY, dag_id  # the last interval's end
        assert_exactly_once(url, spec[dag_id]["landing"], START, START + days * DAY)
        assert_no_leaks(url)
        # Every commit names its run; that run's report lists exactly its commits.
        log = {c.desc_id: (c.writer, c.lower, c.upper) for _, c in shard.log(limit=100) if c.kind == "append"}
        reports = _reports(af.home, dag_id)
        assert set(reports) == set(states), (dag_id, sorted(reports), sorted(states))
        listed = {}
        for run_id, rep in reports.items():
            assert rep["upper"] >= rep["target"], (dag_id, run_id, rep)
            for c in rep["committed"]:
                listed[c["desc_id"]] = (f"airflow:{dag_id}/{run_id}", c["lower"], c["upper"])
        assert listed == log, (dag_id, listed, log)
        # The shard's asset events list the same commits (a commit emits exactly one event).
        events = [c for e in af.asset_events() if e["shard"] == shard.info().url for c in e["commits"]]
        assert sorted(c["desc_id"] for c in events) == sorted(log), dag_id
    # --run-backwards with one active run: the newest day ran first and caught up all the days.
    back = _reports(af.home, "bf_backwards")
    newest = back[max(r for r in back if r.startswith("backfill__"))]
    assert [(c["lower"], c["upper"]) for c in newest["committed"]] == [
        (START + d * DAY, START + (d + 1) * DAY) for d in range(3)]
    backfill_runs = [r for r in runs["bf_mixed"] if r["run_id"].startswith("backfill__")]
    assert len(runs["bf_mixed"]) > len(backfill_runs), "no scheduled or manual run raced the backfill"

    # Re-processing driven as Airflow documents it: day 2's source is fixed, then
    # `backfill create --reprocess-behavior completed --dag-run-conf '{"reprocess": true}'`
    # re-runs the completed day-2 run with that conf. A 6th day lands too: a correction is
    # stamped at a time of its own, inside the run's new description [day 6, day 7).
    _reprocess_a_completed_day_through_a_backfill(env, af, spec["bf_default"])


def _rows(t: pa.Table, *, weight: str | None = None, time: bool = False) -> Counter[tuple[Any, ...]]:
    """User rows (and ``_time`` if ``time``) as a multiset, weighted by column ``weight`` (else 1 each)."""
    keys = [c for c in t.column_names if c not in (TIME, DIFF, COUNT)] + ([TIME] if time else [])
    out: Counter[tuple[Any, ...]] = Counter()
    for r in t.to_pylist():
        out[tuple(r[c] for c in keys)] += r[weight] if weight else 1
    return +out


def _source(landing: str, lower: int, upper: int) -> pa.Table:
    """The landing zone's rows with ``lower <= event time < upper`` (read directly, not through a shard)."""
    src = LandingSource(landing)
    t = pa.concat_tables([read_landing_file(src.blob(), f, src.schema(), "event_time") for f in src.files()])
    return t.filter(pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper)))


def _reprocess_a_completed_day_through_a_backfill(env: dict[str, str], af: Env, spec: dict[str, Any]) -> None:
    url, landing = spec["shard"], spec["landing"]
    shard = Shard.open(url)
    five = START + 5 * DAY
    assert shard.info().upper == five
    old_day2 = _rows(_source(landing, START + DAY, START + 2 * DAY), time=True)
    old = _rows(_source(landing, START, five))
    src = LandingSource(landing)
    f = next(f for f in src.files() if f.key.startswith("day=001/"))
    rows = read_landing_file(src.blob(), f, src.schema(), "event_time").to_pylist()[2:]  # 2 rows vanish
    rows[0] = {**rows[0], "amount": rows[0]["amount"] + 1000}  # 1 row changes
    fixed = pa.Table.from_pylist([{"user": r["user"], "action": r["action"], "amount": r["amount"],
                                   "event_time": r[TIME]} for r in rows])
    src.blob().put(f.key, encode(fixed, f.key.rsplit(".", 1)[-1]))
    land_file(landing, "day=005/late-day-6.parquet", landing_table(five, five + DAY, 20, seed=99))
    publish_watermark(landing, five + DAY)
    day2_run = "backfill__2024-01-03T00:00:00+00:00"  # run ids carry the interval end (run_after)
    with airflow_stack(env):
        # The first backfill of bf_default counts as running until the scheduler marks it
        # complete (it may have stopped first): one backfill per DAG at a time, so retry.
        deadline = time.monotonic() + 300
        while True:
            r = subprocess.run([str(VENV_BIN / "airflow"), "backfill", "create", "--dag-id", "bf_default",
                                "--from-date", "2024-01-02", "--to-date", "2024-01-02", "--reprocess-behavior",
                                "completed", "--dag-run-conf", json.dumps({"reprocess": True})],
                               env=env, capture_output=True, text=True, timeout=180)
            busy = "AlreadyRunningBackfill" in r.stdout + r.stderr or "database is locked" in r.stdout + r.stderr
            if r.returncode == 0 or not busy or time.monotonic() > deadline:
                ok(r)
                break
            time.sleep(5)
        deadline = time.monotonic() + 1200
        while True:
            state = {r["run_id"]: r["state"] for r in _runs(env, "bf_default")}.get(day2_run)
            if state in ("success", "failed") and Shard.open(url).info().upper != five:
                break
            assert time.monotonic() < deadline, f"the re-processing run did not finish ({state})"
            time.sleep(2)
    assert state == "success"
    info = Shard.open(url).info()
    assert info.upper == five + DAY
    now = _rows(_source(landing, START, five + DAY))
    assert now != old
    assert _rows(shard.snapshot(five + DAY - 1), weight=COUNT) == now  # corrected, with day 6
    assert _rows(shard.snapshot(five - 1), weight=COUNT) == old  # history before the correction
    sealed = shard.changes(START + DAY, START + 2 * DAY)
    assert _rows(sealed, weight=DIFF, time=True) == old_day2  # sealed updates are never rewritten
    rep = _reports(af.home, "bf_default")[day2_run]
    assert [c["corrects"] for c in rep["committed"] if c.get("corrects")] == [[START + DAY, START + 2 * DAY]]
