"""A backfill as fast as the cluster (issue 34): the same N-interval backfill at ``max_active_runs``
10 and at 1, in one run, on the production shape (tests/topology/topo_stack.py: PostgreSQL, Redis,
the CeleryExecutor with two workers, a Spark standalone cluster with two workers, S3 on moto).

Two arms, each at both concurrencies, each on its own landing zone and shard, per engine
(``--engine``, issue 45): ``connect`` (default: the DAGs' ``SparkOptions(engine="connect")``, a
day's two write slots are sessions of one Spark Connect server beside the stack,
``local[--connect-cores]``, started by this process and so counted in its CPU, reaching S3 through
the same ``AWS_ENDPOINT_URL`` as the stack), ``submit`` (two spark-submits on the cluster) or
``both`` (each engine at both concurrencies, in the same run, on the same landing zones):

* **cpu-bound**: synthetic days (``--files`` Parquet files of ``--rows`` rows in each day's
  folder);
* **io-bound**: the same days, but every GET of a landing-zone data file (not the shard's
  objects) waits 2 s in an HTTP proxy in front of moto (tests/support/faultproxy.py; the whole
  stack reaches S3 through it via ``AWS_ENDPOINT_URL``), so a day's mint and write mostly wait:
  a small file is one GET, and the mint indexes a day's new files in turn, as each write slot
  reads its files in turn (16 files a day: 32 s in the mint, 16 s in each of the two slots).

A 1-interval warm-up backfill per engine runs first, unmeasured. Measured per backfill: wall (``airflow
backfill create`` to the last run's end), CPU seconds of
this process tree (every daemon of the stack, their tasks and JVMs, the Connect server and its
Python workers, moto and the proxy;
PostgreSQL left out: it daemonizes) and, from Airflow's task-instance records, the critical
path (the chain of writes and appends that ended last) and "appends after the last write":
the last append's end minus the last write's end, per append that ended after the last write.
The floor: no order beats the first write's start plus the CPU spent after it over the cores
(sampled every second, with how busy the machine's cores were while writing). Every backfill is checked:
every run green, the shard equals the source exactly once, ``shardsink verify`` exits 0, and
after ``shardsink gc`` no part leaked. Targets: wall(10) <= 0.6 x wall(1) cpu-bound with
spark-submit, <= 0.8 x with Connect (on 2 cores), <= 0.3 x io-bound; appends after the last write
<= 2 s per interval. The table and figures: bench/backfill_report.py.

The landing zone uses the declared day-folder layout (``dt=YYYY-MM-DD``, lateness 0d), so each
mint lists and indexes its own day's files. ``--slots``: task slots per Celery worker and cores
per Spark worker (default 6: 12 task slots and 12 executor cores, most of ten runs' writes at
once, as on a cluster sized for the backfill; the tests use 2). Ends with
``FIGURE backfill cpu-bound <ratio> io-bound <ratio> engine <engine>`` per engine (Connect's
first) and appends the figures, a row per arm and engine, to bench/RESULTS.md (not with
``--quick``: 3 intervals, for development).

    python bench/backfill.py [--engine connect|submit|both] [--quick] [--days N] [--files F] [--slots S]
                             [--connect-cores N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backfill_report import CORES, DELAY_S, critical_path, report, timeline

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "topology"), str(REPO / "plugins"),
                str(Path(__file__).resolve().parent)]
DAY = 86_400_000
START = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1000)
BUCKET = "shardsink-bench"
ENGINES = {"connect": ("connect",), "submit": ("submit",), "both": ("connect", "submit")}
SPARK = {"submit": 'SparkOptions(conf={"spark.sql.shuffle.partitions": "2"})',
         "connect": 'SparkOptions(engine="connect")'}  # connection spark_connect_default: start_connect

DAG_FILE = '''
"""bench/backfill.py's ingest DAG for one arm."""
from datetime import UTC, datetime, timedelta
from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, ingest_dag
from shardsink.sources import LandingSource

START = datetime(2024, 1, 1, tzinfo=UTC)
ingest = ingest_dag(
    dag_id="{dag_id}", shard_url="{shard}", writers=2, schedule="@daily", start_date=START,
    end_date=START + timedelta(days={days}),
    source=LandingSource("{landing}", time_column="event_time", partitions="dt=YYYY-MM-DD", lateness="0d"),
    shard=ShardOptions(max_span=timedelta(days=1)), spark={spark},
    attempts=AttemptOptions(backoff=0.5, task_retries=2, task_retry_delay=timedelta(seconds=2),
                            catch_up_after=timedelta(minutes=30), poke_interval=timedelta(seconds=1)),
)
'''


@dataclass(frozen=True)
class Arm:
    """One arm of one engine: its landing zone and, per ``max_active_runs``, its DAG id and shard URL."""

    name: str
    engine: str
    landing: str
    dags: dict[int, tuple[str, str]]
    delay: Any = None  #: the proxy's delay rule (io-bound): its ``fired`` counts the delayed GETs


def land(landing: str, days: int, files: int, rows: int) -> None:
    """``files`` Parquet files of ``rows`` rows in each day's ``dt=YYYY-MM-DD/`` folder; the
    watermark at the end of the last day."""
    from shardsink_dev.synthetic import land_file, landing_table, publish_watermark

    for d in range(days):
        day = datetime.fromtimestamp((START + d * DAY) / 1000, tz=UTC).strftime("%Y-%m-%d")
        for i in range(files):
            t = landing_table(START + d * DAY, START + (d + 1) * DAY, rows, seed=7000 + d * 31 + i)
            land_file(landing, f"dt={day}/events-{i}.parquet", t)
    publish_watermark(landing, START + days * DAY)


class Sampler(threading.Thread):
    """Every second beside a backfill: (epoch s, this process tree's CPU s, the machine's busy
    core-seconds from /proc/stat). Gives the CPU spent after a moment and how busy the cores were
    between two moments."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []
        self._done = threading.Event()

    def sample(self) -> None:
        from proc_cpu import machine_busy, tree_cpu

        self.samples.append((time.time(), tree_cpu(os.getpid()), machine_busy()))

    def run(self) -> None:
        while not self._done.wait(1.0):  # a sampling period, not an ordering
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.sample()

    def at(self, t: float) -> tuple[float, float, float]:
        """The first sample at or after ``t`` (else the last)."""
        return next((x for x in self.samples if x[0] >= t), self.samples[-1])


def run_backfill(topo: Any, arm: Arm, mar: int, days: int) -> dict[str, Any]:
    """One backfill of ``days`` days at ``max_active_runs`` ``mar``; measured and checked."""
    from topo_stack import VENV_BIN

    from tests.airflow.af_helpers import assert_exactly_once, assert_no_leaks, ok

    dag_id, shard = arm.dags[mar]
    topo.unpause(dag_id)
    load0 = os.getloadavg()[0]
    t0 = time.time()
    sampler = Sampler()
    sampler.sample()  # the first sample: the CPU the backfill's is counted from
    sampler.start()
    fired = arm.delay.fired if arm.delay is not None else 0
    ok(topo.airflow("backfill", "create", "--dag-id", dag_id, "--from-date", "2024-01-01",
                    "--to-date", f"2024-01-{days:02d}", "--max-active-runs", str(mar)))
    runs = topo.wait_for_runs(dag_id, at_least=days, timeout=400 * days)
    sampler.stop()
    cpu = sampler.samples[-1][1] - sampler.samples[0][1]
    delayed = (arm.delay.fired if arm.delay is not None else 0) - fired
    bad = [(r["dag_run_id"], r["state"]) for r in runs if r["state"] != "success"]
    assert not bad, f"{dag_id}: runs not green: {bad}"
    tl = timeline(topo.task_instances(dag_id), runs, t0)
    wall = max(d["end"] for d in tl)
    last_write, last_append = max(d["write"][1] for d in tl), max(d["append"][1] for d in tl)
    end = START + days * DAY
    if arm.delay is not None:  # the check reads every landing file: not at 2 s a GET (5 min an arm)
        arm.delay.times = arm.delay.fired
    try:
        assert_exactly_once(shard, arm.landing, START, end)
    finally:
        if arm.delay is not None:
            arm.delay.times = None
    for argv in (["verify", shard], ["gc", shard, "--grace", "0s"]):
        r = subprocess.run([str(VENV_BIN / "shardsink"), *argv], env=topo.env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"shardsink {' '.join(argv)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert_no_leaks(shard)
    # The floor this machine puts under the wall whatever the order: nothing is written before
    # the first write starts, and the CPU spent from then on cannot go faster than the cores.
    first_write = min(d["write"][0] for d in tl)
    (_, cpu0, busy0), (_, _, busy1) = sampler.at(t0 + first_write), sampler.at(t0 + last_write)
    cpu_after = sampler.samples[-1][1] - cpu0
    busy_share = (busy1 - busy0) / max((last_write - first_write) * CORES, 1e-9)
    # The appends still to come once the last write is done: those that ended after it.
    after = sum(d["append"][1] > last_write for d in tl)
    got = {"engine": arm.engine, "arm": arm.name, "max_active_runs": mar, "days": days, "wall_s": wall, "cpu_s": cpu,
           "appends_after_last_write_s": last_append - last_write, "appends_after_last_write": after,
           "per_interval_s": (last_append - last_write) / max(after, 1), "critical_path": critical_path(tl),
           "delayed_gets": delayed, "first_write_s": first_write, "cpu_after_first_write_s": cpu_after,
           "floor_s": first_write + cpu_after / CORES, "busy_share_writing": busy_share,
           "overlapped": sum(later["write"][0] < earlier["append"][1] for earlier, later in itertools.pairwise(tl)),
           "load_start_end": [load0, os.getloadavg()[0]], "timeline": tl}
    print(f"[{arm.engine} {arm.name} x{mar}] wall {wall:.0f} s, CPU {cpu:.0f} s, appends after the last write "
          f"{got['appends_after_last_write_s']:.1f} s for {after} intervals ({got['per_interval_s']:.2f} s each), "
          f"{delayed} landing GETs delayed {DELAY_S:.0f} s, "
          f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; first write at {first_write:.0f} s, {cpu_after:.0f} CPU-s "
          f"after it: floor {got['floor_s']:.0f} s; cores {busy_share:.0%} busy while writing\n"
          f"  critical path: {got['critical_path']}", flush=True)
    for d in tl:
        print(f"    {d['day']}: mint {d['mint'][0]:6.0f}-{d['mint'][1]:<6.0f} writes {d['write'][0]:6.0f}-"
              f"{d['write'][1]:<6.0f} append {d['append'][0]:6.0f}-{d['append'][1]:<6.0f}", flush=True)
    return got


def start_connect(stack: ExitStack, topo: Any, root: Path, cores: int) -> Any:
    """The Connect engine's server beside the stack (tests/topology/conftest.py's ``connect_conn``):
    ``local[cores]``, reaching S3 as the stack does (through the fault proxy: the same
    ``AWS_ENDPOINT_URL``), registered as the Airflow connection ``spark_connect_default``. A child
    of this process, so that its CPU (JVM and Python workers) counts in every backfill's and the floor's."""
    from proc_cpu import tree_cpu

    from shardsink_dev.connect import connect_server

    env = dict(os.environ)
    assert env["AWS_ENDPOINT_URL"] == topo.env["AWS_ENDPOINT_URL"], "the server must reach S3 as the stack does"
    server = stack.enter_context(connect_server(folder=root / "connect", cores=cores, env=env))
    assert server.proc is not None
    pid = server.proc.pid  # spark-submit execs the server's JVM: this pid is the JVM
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert ppid == os.getpid(), f"the Connect server ({pid}) is no child of the bench: its CPU is not counted"
    assert tree_cpu(pid) > 0  # its JVM has run: counted under this process from now on
    r = topo.airflow("connections", "add", "spark_connect_default", "--conn-json", server.airflow_connection())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    print(f"Spark Connect server at {server.url} (local[{cores}], log {server.log_path})", flush=True)
    return server


def make_arms(proxy: Any, engines: tuple[str, ...], days: int, files: int, rows: int) -> list[Arm]:
    """The arms, per engine (its own DAGs and shards) and per kind; an arm's landing zone is its
    kind's in every engine (only read)."""
    arms = []
    for name in ("cpu", "io"):
        prefix = f"s3://{BUCKET}/backfill-{name}-{uuid.uuid4().hex[:8]}"
        land(f"{prefix}/landing", days, files, rows)
        delay = None if name == "cpu" else proxy.add(  # after landing: only reads wait
            "delay", method="GET", key=rf"{prefix[len(f's3://{BUCKET}/'):]}/landing/.*\.parquet",
            seconds=DELAY_S, phase="before", times=None)
        for engine in engines:
            arms.append(Arm(name, engine, f"{prefix}/landing", {
                mar: (f"backfill_{engine}_{name}_{mar}", f"{prefix}/shard-{engine}-{mar}") for mar in (10, 1)}, delay))
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 intervals (development)")
    ap.add_argument("--engine", choices=tuple(ENGINES), default="connect",
                    help="the write tasks' Spark engine (both: each at both concurrencies, in the same run)")
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--files", type=int, default=16, help="landing files per day (Parquet)")
    ap.add_argument("--rows", type=int, default=40, help="rows per landing file")
    ap.add_argument("--slots", type=int, default=6)
    ap.add_argument("--connect-cores", type=int, default=2, help="the Connect server's local[N]")
    ap.add_argument("--broker-order", action="store_true",
                    help="Airflow's default parallelism (32): tasks queue in Celery's broker in arrival order "
                         "(default: parallelism = the workers' slots, so they wait in Airflow's priority order)")
    a = ap.parse_args()
    days, engines = (3 if a.quick else a.days), ENGINES[a.engine]
    for name, v, hi in (("--days", days, 28), ("--files", a.files, 50), ("--rows", a.rows, 1_000_000),
                        ("--slots", a.slots, 16), ("--connect-cores", a.connect_cores, 16)):
        if not 1 <= v <= hi:
            ap.error(f"{name} {v}: expected 1..{hi}")

    from support.faultproxy import fault_proxy
    from topo_stack import topology_stack

    # SIGTERM or SIGINT (even when started in the background, which ignores SIGINT) stops the
    # stack: its daemons run in process groups of their own and outlive a bare kill of this process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)

    from shardsink_dev.testing import moto_server

    results = []
    with ExitStack() as stack:
        moto = stack.enter_context(moto_server())
        moto.make_bucket(BUCKET)
        os.environ.update(moto.env())
        proxy = stack.enter_context(fault_proxy(moto.endpoint))
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        arms = make_arms(proxy, engines, days, a.files, a.rows)
        print(f"starting the production shape ({a.slots} slots), load {os.getloadavg()[0]:.1f}", flush=True)
        root = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
        topo = stack.enter_context(topology_stack(root, slots=a.slots, queue_to_slots=not a.broker_order))
        if "connect" in engines:
            start_connect(stack, topo, root, a.connect_cores)
        # A 1-interval warm-up per engine first, not measured: the stack's first tasks (Celery
        # workers' and the triggerer's first imports, the cluster's first applications, the
        # Connect server's first write) cost every arm alike.
        warm = [Arm("warm-up", e, arms[0].landing, {1: (f"backfill_warmup_{e}", f"{arms[0].landing}-warmup-{e}")})
                for e in engines]
        for arm in (*warm, *arms):
            for dag_id, shard in arm.dags.values():
                topo.add_dag_file(f"{dag_id}.py", DAG_FILE.format(
                    dag_id=dag_id, shard=shard, landing=arm.landing, days=1 if arm in warm else days,
                    spark=SPARK[arm.engine]))
        topo.wait_for_dags(*(d for arm in (*warm, *arms) for d, _ in arm.dags.values()))
        for arm in warm:
            run_backfill(topo, arm, 1, 1)
        for arm in arms:
            for mar in (10, 1):
                results.append(run_backfill(topo, arm, mar, days))
    report(results, engines=engines, days=days, files=a.files, rows=a.rows, slots=a.slots,
           connect_cores=a.connect_cores, quick=a.quick, queue_to_slots=not a.broker_order)


if __name__ == "__main__":
    main()
