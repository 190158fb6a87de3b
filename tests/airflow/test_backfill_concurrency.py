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
from pathlib import Path
from typing import Any

import pytest
from af_helpers import DAY, START, VENV_BIN, Env, airflow_stack, assert_exactly_once, assert_no_leaks, ok

from shardsink import Shard
from shardsink_dev.synthetic import generate
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
    r = subprocess.run([str(VENV_BIN / "airflow"), "dags", "list-runs", dag_id, "-o", "json"], env=env,
                       capture_output=True, text=True, timeout=120)
    try:
        return list(json.loads(r.stdout))
    except ValueError:
        return []


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
            time.sleep(5)
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
