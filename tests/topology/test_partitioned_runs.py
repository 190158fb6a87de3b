"""Partitioned runs (Airflow 3.2+ asset partitions) under the production topology (the
``topology`` fixture: PostgreSQL, CeleryExecutor, scheduler, triggerer, moto S3). The ingest
writes and the view jobs are sessions of the stack's Spark Connect server (conftest's
``connect_conn``; no JVM per job): nothing here is about where Spark runs
(test_production_shape.py is).

ONE scenario, kept small (3 daily partitions): the ingest DAG is scheduled by
``daily_partitions()`` and the view DAG per partition of its input (``InputPartitions``).

* ``airflow backfill create`` over 3 partitions: one run per key, each covering exactly the
  day its key names (one commit ``[day, day + 1)`` per run, the shard holding the 3 days
  exactly once), each asset event carrying its run's key and range;
* the view gets one run per partition key (Airflow's partitioned asset scheduling), each
  ending at its key's day (a run that starts before an earlier key's also covers that day:
  views cannot mint ahead), its events tiling the days once, and equals its query over the shard;
* a manual run with a key the DAG's key format does not produce (``2024-1-2``: Airflow's
  lenient parse accepts it) fails at its mint, naming the key and the format, nothing written.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from topo_stack import Topology, wait_for

from shardsink import Shard
from shardsink_dev.synthetic import generate
from tests.airflow.af_helpers import DAY, START, assert_exactly_once, assert_no_leaks, ok

INGEST_DAG = "pt_ingest"
VIEW_DAG = "pt_view"
DAYS = 3
KEYS = [f"2024-01-{d + 1:02d}" for d in range(DAYS)]
BAD_RUN = "manual__bad_partition_key"

DAG_FILE = '''
"""Partitioned DAGs (written by tests/topology/test_partitioned_runs.py)."""
from datetime import UTC, datetime, timedelta
from shardsink.airflow import (AttemptOptions, InputPartitions, ShardOptions, SparkOptions, daily_partitions,
                               ingest_dag, view_dag)
from shardsink.sinks.materialize import ViewInput, view
from shardsink.sources import LandingSource

ATTEMPTS = AttemptOptions(backoff=0.5, task_retries=2, task_retry_delay=timedelta(seconds=2),
                          catch_up_after=timedelta(minutes=10), poke_interval=timedelta(seconds=5))
SPARK = SparkOptions(engine="connect")  # connection spark_connect_default: conftest's connect_conn
START = datetime(2024, 1, 1, tzinfo=UTC)

ingest = ingest_dag(
    dag_id="{ingest}", shard_url="{shard}", source=LandingSource("{landing}", time_column="event_time"),
    writers=1, schedule=daily_partitions(), start_date=START, end_date=START + timedelta(days={days}),
    shard=ShardOptions(max_span=timedelta(days=1)), attempts=ATTEMPTS, spark=SPARK,
)
per_day = view_dag(
    dag_id="{view}", output_url="{view_url}", start_date=START, attempts=ATTEMPTS, spark=SPARK,
    schedule=InputPartitions(period="daily"),
    view=view(inputs={{"events": ViewInput("{shard}", mode="updates")}}, sql="""
        SELECT user, to_date(timestamp_millis(_time)) AS day, sum(_diff) AS events
        FROM events GROUP BY user, to_date(timestamp_millis(_time)) HAVING sum(_diff) <> 0"""),
)
'''


def _day_of(key: str) -> tuple[int, int]:
    d = KEYS.index(key)
    return START + d * DAY, START + (d + 1) * DAY


def _view_from_shard(url: str, upper: int) -> Counter[tuple[Any, ...]]:
    per: Counter[tuple[str, date]] = Counter()
    for r in Shard.open(url).changes(START, upper).to_pylist():
        per[(r["user"], datetime.fromtimestamp(r["_time"] / 1000, tz=UTC).date())] += r["_diff"]
    return Counter({(u, d, n): 1 for (u, d), n in per.items() if n})


def _view(url: str) -> Counter[tuple[Any, ...]]:
    return Counter({(r["user"], r["day"], r["events"]): r["_count"] for r in Shard.open(url).snapshot().to_pylist()})


def _report(topology: Topology, dag_id: str, run_id: str) -> dict[str, Any]:
    return dict(topology.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/report/"
                                    "xcomEntries/return_value?deserialize=true")["value"])


def _events(topology: Topology, dag_id: str) -> list[dict[str, Any]]:
    return list(topology.api("GET", f"/assets/events?source_dag_id={dag_id}&limit=100")["asset_events"])


@pytest.mark.timeout(1500)
def test_a_backfill_over_partitions_covers_each_once_and_views_run_per_partition(topology: Topology,
                                                                              connect_conn: str) -> None:
    prefix = f"s3://shardsink-test/pt-{uuid.uuid4().hex[:10]}"
    landing, shard_url, view_url = f"{prefix}/landing", f"{prefix}/events", f"{prefix}/per_user_day"
    generate(landing, start=START, days=DAYS, files_per_day=2, rows_per_file=30)
    topology.add_dag_file("partitions.py", DAG_FILE.format(ingest=INGEST_DAG, view=VIEW_DAG, shard=shard_url,
                                                           view_url=view_url, landing=landing, days=DAYS))
    topology.wait_for_dags(INGEST_DAG, VIEW_DAG)
    for dag_id in (INGEST_DAG, VIEW_DAG):
        topology.unpause(dag_id)
    t0 = time.monotonic()
    ok(topology.airflow("backfill", "create", "--dag-id", INGEST_DAG, "--from-date", KEYS[0], "--to-date", KEYS[-1]))
    end = START + DAYS * DAY
    topology.wait_for_runs(INGEST_DAG, at_least=DAYS, timeout=1200)
    # Airflow's trigger API parses keys leniently ("2024-1-2" is January 2nd); the DAG's
    # partitions are keyed "2024-01-02", so the run names no partition of it: refused.
    # SUBTLE: triggered after the backfill's runs: a backfill skips a partition whose date
    # an unfinished run already has ("in flight"), and "2024-1-2" has January 2nd's.
    topology.api("POST", f"/dags/{INGEST_DAG}/dagRuns", {"logical_date": None, "dag_run_id": BAD_RUN,
                                                         "partition_key": "2024-1-2"})
    runs = topology.wait_for_runs(INGEST_DAG, at_least=DAYS + 1, timeout=600)
    view_runs = topology.wait_for_runs(VIEW_DAG, at_least=DAYS, timeout=600,
                                       done=lambda _: Shard.open(view_url).info().upper == end)
    print(f"ingest and view runs finished {time.monotonic() - t0:.0f}s after the backfill was created")

    # One backfill run per partition key, all green; the bad key's run failed.
    states = {r["dag_run_id"]: (r["run_type"], r["partition_key"], r["state"]) for r in runs}
    assert states.pop(BAD_RUN)[2] == "failed"
    assert sorted(states.values()) == [("backfill", k, "success") for k in KEYS], states

    # Each run committed exactly the day its key names; the shard holds the days exactly once.
    shard = Shard.open(shard_url)
    assert shard.info().upper == end
    assert_exactly_once(shard_url, landing, START, end)
    assert_no_leaks(shard_url)
    key_of = {f"airflow:{INGEST_DAG}/{run_id}": key for run_id, (_, key, _) in states.items()}
    commits = sorted((key_of[c.writer], c.lower, c.upper) for _, c in shard.log(limit=100) if c.kind == "append")
    assert commits == [(k, *_day_of(k)) for k in KEYS]
    for run_id, (_, key, _) in states.items():
        rep = _report(topology, INGEST_DAG, run_id)
        assert rep["target"] == _day_of(key)[1] <= rep["upper"], (run_id, rep)
    # Its asset events carry the key (Airflow stamps the run's key on the outlet event).
    events = sorted((e["partition_key"], e["extra"]["lower"], e["extra"]["upper"]) for e in _events(
        topology, INGEST_DAG))
    assert events == [(k, *_day_of(k)) for k in KEYS]
    _assert_bad_key_refused(topology)

    # The view ran once per partition of its input, each run covering its key's day.
    assert sorted((r["partition_key"], r["state"]) for r in view_runs) == [(k, "success") for k in KEYS]
    for r in view_runs:
        rep = _report(topology, VIEW_DAG, r["dag_run_id"])
        assert rep["target"] == _day_of(r["partition_key"])[1] <= rep["upper"], (r["dag_run_id"], rep)
    assert _view(view_url) == _view_from_shard(shard_url, end)
    view_events = _events(topology, VIEW_DAG)
    assert {e["partition_key"] for e in view_events} <= set(KEYS)
    # Each event ends at its key's day and starts where the view stood: the events tile the days
    # once. SUBTLE: the ingest's append tasks finish (and emit their keys' events) in any order,
    # so a later key's view run may start first; it then covers the earlier days too (a view
    # cannot mint ahead: its correction reads the output as of its lower), and the earlier key's
    # run finds its day covered (a green no-op, no event).
    spans = sorted((e["extra"]["lower"], e["extra"]["upper"], e["partition_key"]) for e in view_events)
    assert all(u == _day_of(k)[1] for _, u, k in spans), spans
    assert [lo for lo, _, _ in spans] == [START, *(u for _, u, _ in spans[:-1])] and spans[-1][1] == end, spans
    # The ingest writes and the view jobs were sessions of the Connect server (their task logs say
    # so): no Spark application of either DAG.
    apps = [a["properties"] for a in topology.spark_apps().values()]
    assert not [a for a in apps if any(f"-{d}-" in str(a.get("spark.app.name")) for d in (INGEST_DAG, VIEW_DAG))]
    home = Path(topology.env["AIRFLOW_HOME"]) / "logs"
    for dag_id, least in ((INGEST_DAG, DAYS), (VIEW_DAG, 1)):
        writes = [t for p in (home / f"dag_id={dag_id}").rglob("task_id=attempt_*.write/**/*.log")
                  if "writing slot" in (t := p.read_text())]
        assert len(writes) >= least and all("over Spark Connect" in t for t in writes), (dag_id, len(writes))


def _assert_bad_key_refused(topology: Topology) -> None:
    """The bad key's run: its first mint failed (its own failure ends the task: no retry of it),
    nothing after it ran, and its log names the key and the expected format."""
    tis = {ti["task_id"]: ti for ti in topology.task_instances(INGEST_DAG) if ti["dag_run_id"] == BAD_RUN}
    mint = tis["attempt_1.mint"]
    assert mint["state"] == "failed", mint
    assert not [t for t, ti in tis.items() if t.endswith((".write", ".append")) and ti["state"] == "success"]
    try_number = mint["try_number"]  # > 1 only if the topology lost a try before the task ran (no task code)
    path = f"/dags/{INGEST_DAG}/dagRuns/{BAD_RUN}/taskInstances/attempt_1.mint/logs/{try_number}?full_content=true"

    def log_text() -> str | None:
        text = str(topology.api("GET", path))
        return text if "2024-1-2" in text else None
    text = wait_for("the bad key's mint log", log_text, timeout=60, every=2)
    assert "%Y-%m-%d" in text and "nothing was written" in text, text[-2000:]
