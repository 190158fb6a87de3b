"""A backfill executed by a real scheduler: scheduler + dag-processor + api-server in the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from af_helpers import DAY, START, VENV_BIN, Env, assert_exactly_once, assert_no_leaks, ok

from shardsink import Shard
from shardsink_dev.synthetic import generate
from shardsink_dev.testing import free_port


@contextmanager
def airflow_stack(env: dict[str, str]) -> Iterator[None]:
    """api-server (execution API only), scheduler and dag-processor; stopped on exit."""
    logs = env["AIRFLOW_HOME"]
    procs = []
    try:
        for name, args in (("api", ["api-server", "--port", env["_API_PORT"], "--workers", "1", "--apps", "execution"]),
                           ("scheduler", ["scheduler", "--skip-serve-logs"]),
                           ("dag-processor", ["dag-processor"])):
            out = open(f"{logs}/{name}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen([str(VENV_BIN / "airflow"), *args], env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True), out))
        url = f"http://127.0.0.1:{env['_API_PORT']}/execution/health"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("api-server did not become healthy") from None
                time.sleep(0.5)
        yield
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p, out in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.close()


def _runs(env: dict[str, str]) -> list[dict[str, str]]:
    r = subprocess.run([str(VENV_BIN / "airflow"), "dags", "list-runs", "example_ingest", "-o", "json"], env=env,
                       capture_output=True, text=True, timeout=120)
    try:
        return [x for x in json.loads(r.stdout) if x["run_id"].startswith("backfill__")]
    except ValueError:
        return []


def test_backfill_with_a_real_scheduler_fills_every_interval_exactly_once(af: Env) -> None:
    generate(af.landing, start=START, days=3, files_per_day=2, rows_per_file=100)
    port = free_port()
    env = {**af.env, "_API_PORT": str(port),
           "SHARDSINK_WRITERS": "1",  # keeps the test lean; N writers are covered by the dags-test e2e
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__PARALLELISM": "2",
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
           "AIRFLOW__API_AUTH__JWT_SECRET": "shardsink-test-jwt-secret-not-for-production",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
           "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
    ok(subprocess.run([str(VENV_BIN / "airflow"), "dags", "reserialize"], env=env, capture_output=True, text=True,
                      timeout=180))
    with airflow_stack(env):
        ok(subprocess.run([str(VENV_BIN / "airflow"), "backfill", "create", "--dag-id", "example_ingest",
                           "--from-date", "2024-01-01", "--to-date", "2024-01-03",
                           # As docs/runbooks/backfill.md prescribes: runs of one shard serialise on
                           # its upper, and a backfill ignores the DAG's max_active_runs (default 10).
                           "--max-active-runs", "1"], env=env, capture_output=True,
                          text=True, timeout=180))
        deadline = time.monotonic() + 600
        while True:
            runs = _runs(env)
            states = sorted(r["state"] for r in runs)
            if len(runs) == 3 and all(s in ("success", "failed") for s in states):
                break
            assert time.monotonic() < deadline, f"backfill did not finish: {states}"
            time.sleep(3)
    assert states == ["success"] * 3, states
    info = Shard.open(af.shard_url).info()
    assert info.upper == START + 3 * DAY  # the last interval's end
    assert_exactly_once(af.shard_url, af.landing, START, START + 3 * DAY)
    assert_no_leaks(af.shard_url)
    # Only the ingest shard's events: the example view DAG (scheduled on this shard's asset) runs too.
    mine = [e for e in af.asset_events() if e["shard"] == info.url]
    assert sorted((e["lower"], e["upper"]) for e in mine) == [
        (START + d * DAY, START + (d + 1) * DAY) for d in range(3)]
