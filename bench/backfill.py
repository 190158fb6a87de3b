"""A backfill as fast as the cluster (issue 34): the same N-interval backfill at ``max_active_runs``
10 and at 1, in one run, on the production shape (tests/topology/topo_stack.py: PostgreSQL, Redis,
the CeleryExecutor with two workers, a Spark standalone cluster with two workers, S3 on moto).

Two arms, each at both concurrencies, each on its own landing zone and shard:

* **cpu-bound**: synthetic days (``--files`` Parquet files of ``--rows`` rows in each day's
  folder); a day's write is two spark-submits on the cluster;
* **io-bound**: the same days, but every GET of a landing-zone data file (not the shard's
  objects) waits 2 s in an HTTP proxy in front of moto (tests/support/faultproxy.py; the whole
  stack reaches S3 through it via ``AWS_ENDPOINT_URL``), so a day's mint and write mostly wait:
  a small file is one GET, and the mint indexes a day's new files in turn, as each write slot
  reads its files in turn (16 files a day: 32 s in the mint, 16 s in each of the two slots).

A 1-interval warm-up backfill runs first, unmeasured. Measured per backfill: wall (``airflow
backfill create`` to the last run's end), CPU seconds of
this process tree (every daemon of the stack, their tasks and JVMs, moto and the proxy;
PostgreSQL left out: it daemonizes) and, from Airflow's task-instance records, the critical
path (the chain of writes and appends that ended last) and "appends after the last write":
the last append's end minus the last write's end, per append that ended after the last write.
The floor: no order beats the first write's start plus the CPU spent after it over the cores
(sampled every second, with how busy the machine's cores were while writing). Every backfill is checked:
every run green, the shard equals the source exactly once, ``shardsink verify`` exits 0, and
after ``shardsink gc`` no part leaked. Targets: wall(10) <= 0.6 x wall(1) cpu-bound, <= 0.3 x
io-bound; appends after the last write <= 2 s per interval.

The landing zone uses the declared day-folder layout (``dt=YYYY-MM-DD``, lateness 0d), so each
mint lists and indexes its own day's files. ``--slots``: task slots per Celery worker and cores
per Spark worker (default 6: 12 task slots and 12 executor cores, most of ten runs' writes at
once, as on a cluster sized for the backfill; the tests use 2). Ends with
``FIGURE backfill cpu-bound <ratio> io-bound <ratio>`` and appends the figures to
bench/RESULTS.md (not with ``--quick``: 3 intervals, for development).

    python bench/backfill.py [--quick] [--days N] [--files F] [--slots S]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
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

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "topology"), str(REPO / "plugins"),
                str(Path(__file__).resolve().parent)]
RESULTS = Path(__file__).resolve().parent / "results"
DAY = 86_400_000
START = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1000)
BUCKET = "shardsink-bench"
DELAY_S = 2.0
TARGETS = {"cpu": 0.6, "io": 0.3}
APPEND_TARGET_S = 2.0
CORES = os.cpu_count() or 1

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
    shard=ShardOptions(max_span=timedelta(days=1)), spark=SparkOptions(conf={{"spark.sql.shuffle.partitions": "2"}}),
    attempts=AttemptOptions(backoff=0.5, task_retries=2, task_retry_delay=timedelta(seconds=2),
                            catch_up_after=timedelta(minutes=30), poke_interval=timedelta(seconds=1)),
)
'''


@dataclass(frozen=True)
class Arm:
    """One arm: its landing zone and, per ``max_active_runs``, its DAG id and shard URL."""

    name: str
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


def _ts(value: str | None) -> float | None:
    return None if not value else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def timeline(tis: list[dict[str, Any]], runs: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """Per run in day order: the mint's, writes' and committing append's start and end (s after t0)."""
    out = []
    for r in sorted(runs, key=lambda r: r["logical_date"]):
        mine = [ti for ti in tis if ti["dag_run_id"] == r["dag_run_id"] and ti["start_date"] and ti["end_date"]
                and ti["state"] != "skipped"]  # a green run skips its later attempts' tasks

        def span(suffix: str, *, ok: bool = False, mine: list[dict[str, Any]] = mine) -> list[float]:
            got = [ti for ti in mine if ti["task_id"].endswith(suffix) and (not ok or ti["state"] == "success")]
            if not got:
                return [float("nan"), float("nan")]
            return [min(_ts(ti["start_date"]) or 0 for ti in got) - t0,
                    max(_ts(ti["end_date"]) or 0 for ti in got) - t0]

        out.append({"day": r["logical_date"][:10], "mint": span(".mint"), "write": span(".write"),
                    "append": span(".append", ok=True), "end": (_ts(r["end_date"]) or t0) - t0})
    return out


def critical_path(tl: list[dict[str, Any]]) -> str:
    """Walk back from the last commit: a day's append waited for its own writes or for the day before's."""
    chain, i = [], len(tl) - 1
    while i >= 0:
        d = tl[i]
        chain.append(f"{d['day']} append {d['append'][0]:.0f}-{d['append'][1]:.0f}s")
        if i == 0 or d["write"][1] >= tl[i - 1]["append"][1]:
            chain.append(f"{d['day']} writes {d['write'][0]:.0f}-{d['write'][1]:.0f}s")
            chain.append(f"{d['day']} mint {d['mint'][0]:.0f}-{d['mint'][1]:.0f}s")
            break
        i -= 1
    return " <- ".join(chain)


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
    assert_exactly_once(shard, arm.landing, START, end)
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
    got = {"arm": arm.name, "max_active_runs": mar, "days": days, "wall_s": wall, "cpu_s": cpu,
           "appends_after_last_write_s": last_append - last_write, "appends_after_last_write": after,
           "per_interval_s": (last_append - last_write) / max(after, 1), "critical_path": critical_path(tl),
           "delayed_gets": delayed, "first_write_s": first_write, "cpu_after_first_write_s": cpu_after,
           "floor_s": first_write + cpu_after / CORES, "busy_share_writing": busy_share,
           "overlapped": sum(later["write"][0] < earlier["append"][1] for earlier, later in itertools.pairwise(tl)),
           "load_start_end": [load0, os.getloadavg()[0]], "timeline": tl}
    print(f"[{arm.name} x{mar}] wall {wall:.0f} s, CPU {cpu:.0f} s, appends after the last write "
          f"{got['appends_after_last_write_s']:.1f} s for {after} intervals ({got['per_interval_s']:.2f} s each), "
          f"{delayed} landing GETs delayed {DELAY_S:.0f} s, "
          f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; first write at {first_write:.0f} s, {cpu_after:.0f} CPU-s "
          f"after it: floor {got['floor_s']:.0f} s; cores {busy_share:.0%} busy while writing\n"
          f"  critical path: {got['critical_path']}", flush=True)
    for d in tl:
        print(f"    {d['day']}: mint {d['mint'][0]:6.0f}-{d['mint'][1]:<6.0f} writes {d['write'][0]:6.0f}-"
              f"{d['write'][1]:<6.0f} append {d['append'][0]:6.0f}-{d['append'][1]:<6.0f}", flush=True)
    return got


def report(results: list[dict[str, Any]], *, days: int, files: int, rows: int, slots: int, quick: bool) -> None:
    load = os.getloadavg()
    by = {(r["arm"], r["max_active_runs"]): r for r in results}
    ratios = {arm: by[(arm, 10)]["wall_s"] / by[(arm, 1)]["wall_s"] for arm in ("cpu", "io")}
    lines = []
    for arm in ("cpu", "io"):
        par, seq = by[(arm, 10)], by[(arm, 1)]
        worst = max(par["per_interval_s"], seq["per_interval_s"])
        lines.append(
            f"| {arm}-bound, {days} intervals x {files} files x {rows} rows | wall(10)/wall(1) **{ratios[arm]:.2f}** "
            f"(target <= {TARGETS[arm]}; {par['wall_s']:.0f} s vs {seq['wall_s']:.0f} s) | CPU {par['cpu_s']:.0f} s "
            f"vs {seq['cpu_s']:.0f} s (CPU over the cores: {par['cpu_s'] / CORES:.0f} s = "
            f"{par['cpu_s'] / CORES / seq['wall_s']:.2f} x wall(1)) | floor at 10 (first write at "
            f"{par['first_write_s']:.0f} s + {par['cpu_after_first_write_s']:.0f} CPU-s after it over {CORES} cores): "
            f"{par['floor_s']:.0f} s = **{par['floor_s'] / seq['wall_s']:.2f}** x wall(1); cores "
            f"{par['busy_share_writing']:.0%} busy while writing | appends after the last write "
            f"{par['appends_after_last_write_s']:.1f} s for {par['appends_after_last_write']} intervals / "
            f"{seq['appends_after_last_write_s']:.1f} s for {seq['appends_after_last_write']} "
            f"(worst {worst:.2f} s per interval, target <= "
            f"{APPEND_TARGET_S}) | days written before the day before committed: {par['overlapped']} of {days - 1} | "
            f"landing GETs delayed: {par['delayed_gets']} / {seq['delayed_gets']} | load during: "
            f"{'{:.1f}->{:.1f}'.format(*par['load_start_end'])} / {'{:.1f}->{:.1f}'.format(*seq['load_start_end'])} |")
        lines.append(f"| {arm}-bound critical path at 10 | {par['critical_path']} |")
    stamp = time.strftime("%Y-%m-%d %H:%M")
    text = (f"\n## backfill{' (--quick)' if quick else ''} ({stamp}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
            f"{platform.machine()}, {CORES} cpus; {slots} slots per Celery worker and Spark worker; "
            f"io-bound: {DELAY_S:.0f} s per landing GET)\n\n" + "\n".join(lines) + "\n\n"
            "Exactly once against the source, `shardsink verify` exit 0 and no leaked part after `shardsink gc`: "
            "checked for every backfill.\n")
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"backfill{'-quick' if quick else ''}.json").write_text(json.dumps(results, indent=2))
    if not quick:  # a development run's figures stay out of the history
        with (Path(__file__).resolve().parent / "RESULTS.md").open("a") as fh:
            fh.write(text)
    print(f"FIGURE backfill cpu-bound {ratios['cpu']:.2f} io-bound {ratios['io']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 intervals (development)")
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--files", type=int, default=16, help="landing files per day (Parquet)")
    ap.add_argument("--rows", type=int, default=40, help="rows per landing file")
    ap.add_argument("--slots", type=int, default=6)
    a = ap.parse_args()
    days = 3 if a.quick else a.days
    for name, v, hi in (("--days", days, 28), ("--files", a.files, 50), ("--rows", a.rows, 1_000_000),
                        ("--slots", a.slots, 16)):
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
        arms = []
        for name in ("cpu", "io"):
            prefix = f"s3://{BUCKET}/backfill-{name}-{uuid.uuid4().hex[:8]}"
            land(f"{prefix}/landing", days, a.files, a.rows)
            delay = None if name == "cpu" else proxy.add(  # after landing: only reads wait
                "delay", method="GET", key=rf"{prefix[len(f's3://{BUCKET}/'):]}/landing/.*\.parquet",
                seconds=DELAY_S, phase="before", times=None)
            arms.append(Arm(name, f"{prefix}/landing",
                            {mar: (f"backfill_{name}_{mar}", f"{prefix}/shard-{mar}") for mar in (10, 1)}, delay))
        print(f"starting the production shape ({a.slots} slots), load {os.getloadavg()[0]:.1f}", flush=True)
        topo = stack.enter_context(topology_stack(Path(tempfile.mkdtemp(prefix="bench-backfill-")), slots=a.slots))
        # A 1-interval warm-up first, not measured: the stack's first tasks (Celery workers' and
        # the triggerer's first imports, the cluster's first applications) cost every arm alike.
        warm = Arm("warm-up", arms[0].landing, {1: ("backfill_warmup", f"{arms[0].landing}-warmup-shard")})
        for arm in (warm, *arms):
            for dag_id, shard in arm.dags.values():
                topo.add_dag_file(f"{dag_id}.py", DAG_FILE.format(dag_id=dag_id, shard=shard, landing=arm.landing,
                                                                  days=1 if arm is warm else days))
        topo.wait_for_dags(*(d for arm in (warm, *arms) for d, _ in arm.dags.values()))
        run_backfill(topo, warm, 1, 1)
        for arm in arms:
            for mar in (10, 1):
                results.append(run_backfill(topo, arm, mar, days))
    report(results, days=days, files=a.files, rows=a.rows, slots=a.slots, quick=a.quick)


if __name__ == "__main__":
    main()
