"""What one write task costs: a spark-submit application vs a Spark Connect client session (issue 45).

The same N write tasks (default 20 descriptions of one day each, ``--rows`` 300 rows in one
landing file per day, slot 0 of 1, unordered parts) run both ways on this machine, one after
another, each task as a fresh Python process standing for the Airflow task process:

* **submit**: the task process does what ``ShardWriteOperator`` does (the committed check, the
  ``--py-files`` zip) and runs ``spark-submit --master local[2] spark_jobs/ingest_write.py``;
  its CPU is the whole process tree (task process, spark-submit JVM, driver and Python workers),
  from ``RUSAGE_CHILDREN``;
* **connect**: the task process runs the slot as a client session
  (:func:`shardsink.spark.connect.run_over_connect`) of ONE Connect server (local[2],
  ``shardsink_dev.connect``) started before the arm (its start-up is reported, not charged):
  its CPU is the task process plus the server's share, the server tree's CPU over the arm / N.

Wall per task is the task process's life; "staged" is the job's own figure (its summary's
``seconds``: from the job's start to the manifest written). Both arms cache Python bytecode
(``shardsink_dev.connect.python_env``). After each arm every description is appended in order
and the shard must hold every row once, and the server's event log must show no open session.
Ends with ``FIGURE write-cost connect <CPU-s per task> submit <CPU-s per task>``; ``--record``
appends the table to bench/RESULTS.md.

    python bench/write_cost.py [--tasks 20] [--rows 300] [--record]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import _path  # noqa: F401  (repo root on sys.path)
from proc_cpu import tree_cpu

from shardsink import Shard
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sources import source_spec
from shardsink.sources.landing import LandingSource
from shardsink.spark.request import IngestWriteRequest, encode_request
from shardsink_dev.connect import connect_server, python_env
from shardsink_dev.synthetic import generate

ROOT = Path(__file__).resolve().parents[1]
START = 1_704_067_200_000
DAY = 86_400_000

SUBMIT_TASK = """
import json, os, subprocess, sys, tempfile
from shardsink.core.shard import Shard
from shardsink.sinks.ingest import committed
from shardsink.spark import build_pyfiles_zip, job_path
from shardsink.spark.daemon import daemon_conf
from shardsink.spark.request import IngestWriteRequest, decode_request, job_argv
conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
if sys.argv[1] == "daemon":  # as ShardWriteOperator sets it on a local master
    conf = daemon_conf(conf, master="local[2]", worker_python=sys.executable)
text = sys.stdin.read()
req = decode_request(text, IngestWriteRequest)
shard = Shard(req.shard_url)
head = shard.reader().head()
assert committed(shard, req.desc, head=head) is None
out = os.path.join(tempfile.mkdtemp(), "outcome.json")
bin_dir = os.path.dirname(sys.executable)
r = subprocess.run([os.path.join(bin_dir, "spark-submit"), "--master", "local[2]",
                    *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")], "--py-files", build_pyfiles_zip(),
                    job_path(), *job_argv(req), "--result-path", out], capture_output=True, text=True)
assert r.returncode == 0, r.stderr[-3000:]
print(json.dumps(json.load(open(out))["summary"]))
"""

CONNECT_TASK = """
import json, sys, time
T0, C0 = time.monotonic(), time.process_time()
import pyspark.sql.connect.session  # what the task's session needs: timed with the imports
from shardsink.spark.connect import run_over_connect
from shardsink.spark.request import IngestWriteRequest, decode_request
PHASES = {}
if len(sys.argv) > 2:  # per-phase timers (wall, task CPU, server tree CPU; nested phases included)
    sys.path.insert(0, sys.argv[3])
    from proc_cpu import tree_cpu
    import shardsink.sinks.staging as staging, shardsink.spark.connect as engine, shardsink.spark.stage as stage
    from shardsink.sources.landing import LandingSource
    def mark():
        return time.monotonic(), time.process_time(), tree_cpu(int(sys.argv[2]))
    def timed(owner, attr, phase):
        real = getattr(owner, attr)
        def run(*a, **k):
            t = mark()
            try:
                return real(*a, **k)
            finally:
                PHASES[phase] = [x + y - z for x, y, z in zip(PHASES.get(phase, [0, 0, 0]), mark(), t)]
        setattr(owner, attr, run)
    for owner, attr, phase in [(engine, "_open", "open"), (engine, "probe", "probe"),
                               (LandingSource, "read_slot", "read_slot"), (stage, "stage_dataframe", "stage"),
                               (staging, "write_manifest", "manifest"), (engine, "stop_quietly", "stop")]:
        timed(owner, attr, phase)
    PHASES["imports"] = [time.monotonic() - T0, time.process_time() - C0, 0.0]
req = decode_request(sys.stdin.read(), IngestWriteRequest)
out = run_over_connect(req, url=sys.argv[1])
if PHASES:
    print("PHASES " + json.dumps(PHASES))
print(json.dumps(out))
"""

#: The task phases the Connect arm's ``--phases`` reports, in order.
PHASE_NAMES = ("imports", "open", "probe", "read_slot", "stage", "manifest", "stop")


@dataclass
class Arm:
    name: str
    walls: list[float]
    staged: list[float]
    task_cpu: float
    server_cpu: float
    note: str = ""
    phases: list[dict[str, list[float]]] = field(default_factory=list)

    @property
    def cpu_per_task(self) -> float:
        return (self.task_cpu + self.server_cpu) / len(self.walls)


def task_env() -> dict[str, str]:
    """The environment a bench task process runs in: this checkout's shardsink, this interpreter for
    Spark's Python workers and its ``spark-submit`` on the PATH, bytecode cached (``python_env``)."""
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])
    env["PYSPARK_PYTHON"] = sys.executable
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def section_head(bench: str, load: tuple[float, ...], after: tuple[float, ...]) -> str:
    """A bench/RESULTS.md section's heading: the bench, the time, the load before and after, the cores."""
    return (f"## {bench} ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load before "
            f"{' '.join(f'{x:.1f}' for x in load)}, after {' '.join(f'{x:.1f}' for x in after)}, "
            f"{os.cpu_count()} cpus)")


def append_results(head: str, *blocks: str) -> None:
    """Append a section to bench/RESULTS.md: ``head``, then each block, blank lines between."""
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write("".join(f"\n{x}\n" for x in (head, *blocks)))


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def prepare(folder: Path, tasks: int, rows: int) -> tuple[LandingSource, str]:
    landing = folder / "landing"
    generate(str(landing), start=START, days=tasks, files_per_day=1, rows_per_file=rows)
    return LandingSource(str(landing)), str(landing)


def minted(url: str, source: LandingSource, tasks: int) -> list[Description]:
    shard = open_or_create(url, source, initial_upper=START)
    chain = mint_chain(shard, source, interval_end=START + tasks * DAY, max_span=DAY, max_chain=tasks, dag_id="bench",
                       run_id="r", attempt=1)
    assert isinstance(chain, list) and len(chain) == tasks, chain
    return chain


def task_file(folder: Path, script: str) -> str:
    """``script`` as a file to run: a task process runs a file, as Airflow's does (under ``python -c``,
    pyspark's Connect client takes ``__main__`` for a doctest run and imports its test helpers)."""
    path = folder / f"task-{abs(hash(script))}.py"
    path.write_text(script)
    return str(path)


def run_tasks(script: str, args: list[str], url: str, source: LandingSource, descs: list[Description],
              env: dict[str, str]) -> tuple[list[float], list[float], list[dict[str, list[float]]]]:
    import json

    walls, staged, phases = [], [], []
    path = task_file(Path(urlparse(url).path).parent, script)
    for d in descs:
        req = IngestWriteRequest(shard_url=url, source=source_spec(source), desc=d, slot=0, slots=1,
                                 part_order="unordered")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, path, *args], input=encode_request(req), text=True,
                           capture_output=True, env=env)
        walls.append(time.monotonic() - t0)
        if r.returncode != 0:
            raise SystemExit(f"a write task failed:\n{r.stderr[-4000:]}")
        lines = r.stdout.strip().splitlines()
        staged.append(float(json.loads(lines[-1])["seconds"]))
        phases += [json.loads(x[len("PHASES "):]) for x in lines if x.startswith("PHASES ")]
    return walls, staged, phases


def check(url: str, descs: list[Description], rows: int) -> None:
    shard = Shard(url)
    for d in descs:
        res = append_from_manifests(shard, d, 1)
        assert res.status == "committed", res
    total = sum(shard.snapshot()["_count"].to_pylist())
    assert total == rows * len(descs), (total, rows * len(descs))


def arm_submit(folder: Path, source: LandingSource, tasks: int, rows: int, env: dict[str, str], *,
               daemon: bool = True) -> Arm:
    """spark-submit tasks; ``daemon``: with shardsink's worker daemon, as the operator sets it on a local
    master (:func:`shardsink.spark.daemon.daemon_conf`), else Spark's own (the baseline arm)."""
    url = (folder / ("submit" if daemon else "submit-spark-daemon")).as_uri()
    descs = minted(url, source, tasks)
    before = children_cpu()
    walls, staged, _ = run_tasks(SUBMIT_TASK, ["daemon" if daemon else "spark"], url, source, descs, env)
    arm = Arm("submit" if daemon else "submit, Spark's own worker daemon", walls, staged, children_cpu() - before, 0.0)
    check(url, descs, rows)
    return arm


def arm_connect(folder: Path, source: LandingSource, tasks: int, rows: int, env: dict[str, str], *,
                phases: bool = False) -> Arm:
    url = (folder / "connect").as_uri()
    descs = minted(url, source, tasks)
    t0 = time.monotonic()
    with connect_server(folder=folder / "server", env=env) as server:
        assert server.proc is not None
        started = time.monotonic() - t0
        # One unmeasured session warms the server (its first Python worker, the JIT).
        warm = IngestWriteRequest(shard_url=url, source=source_spec(source), desc=descs[0], slot=0, slots=1,
                                  part_order="unordered")
        r = subprocess.run([sys.executable, task_file(folder, CONNECT_TASK), server.url],
                           input=encode_request(warm), text=True, capture_output=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"the warm-up write failed:\n{r.stderr[-4000:]}")
        s0, before = tree_cpu(server.proc.pid), children_cpu()
        extra = [str(server.proc.pid), str(Path(__file__).parent)] if phases else []
        walls, staged, by_phase = run_tasks(CONNECT_TASK, [server.url, *extra], url, source, descs, env)
        task_cpu, server_cpu = children_cpu() - before, tree_cpu(server.proc.pid) - s0
        time.sleep(1)
        left = server.open_sessions()
    arm = Arm("connect", walls, staged, task_cpu, server_cpu,
              note=f"server start {started:.1f} s (not charged), open sessions after: {len(left)}",
              phases=by_phase)
    assert not left, left
    check(url, descs, rows)
    return arm


def phase_table(arm: Arm) -> str:
    """Per task, each phase's mean wall, task CPU and server CPU (nested phases are included in
    their callers': ``read_slot`` holds the probe when it runs there)."""
    n = max(len(arm.phases), 1)
    lines = ["| phase | wall s | task CPU-s | server CPU-s |", "|---|---|---|---|"]
    for name in PHASE_NAMES:
        got = [p[name] for p in arm.phases if name in p]
        w, c, sv = (sum(x[i] for x in got) / n for i in range(3))
        lines.append(f"| {name} | {w:.3f} | {c:.3f} | {sv:.3f} |")
    return "\n".join(lines)


def table(arms: list[Arm], tasks: int, rows: int) -> str:
    lines = [f"| engine (tasks of {rows} rows) | wall per task median (max) | staged median (max) "
             "| CPU-s per task (task process + server share) |", "|---|---|---|---|"]
    for a in arms:
        tasks = len(a.walls)
        lines.append(f"| {a.name} ({tasks} tasks) | {statistics.median(a.walls):.2f} s ({max(a.walls):.2f}) | "
                     f"{statistics.median(a.staged):.2f} s ({max(a.staged):.2f}) | {a.cpu_per_task:.2f} "
                     f"({a.task_cpu / tasks:.2f} + {a.server_cpu / tasks:.2f}) |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20)
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    p.add_argument("--connect-only", action="store_true", help="the Connect arm only (development)")
    p.add_argument("--phases", action="store_true",
                   help="the Connect arm's per-phase wall, task CPU and server CPU (timers add a little)")
    p.add_argument("--submit-baseline", action="store_true",
                   help="also the submit arm with Spark's own worker daemon (before shardsink's, 2026-11-29)")
    p.add_argument("--submit-tasks", type=int, default=None,
                   help="run the first N tasks only in the submit arm (a loaded machine: ~2 min each)")
    a = p.parse_args()
    load = os.getloadavg()
    env = task_env()
    with tempfile.TemporaryDirectory(prefix="shardsink-write-cost-") as tmp:
        folder = Path(tmp)
        source, _ = prepare(folder, a.tasks, a.rows)
        arms = [arm_connect(folder, source, a.tasks, a.rows, env, phases=a.phases)]
        if a.phases:
            print(phase_table(arms[0]), flush=True)
        print(table(arms, a.tasks, a.rows), flush=True)  # each arm as it ends: a long run keeps its figures
        if not a.connect_only:
            arms.append(arm_submit(folder, source, a.submit_tasks or a.tasks, a.rows, env))
            if a.submit_baseline:
                arms.append(arm_submit(folder, source, a.submit_tasks or a.tasks, a.rows, env, daemon=False))
    after = os.getloadavg()
    out = table(arms, a.tasks, a.rows)
    print(out)
    for arm in arms:
        if arm.note:
            print(f"{arm.name}: {arm.note}")
    head = section_head("write_cost", load, after)
    submit = f"{arms[1].cpu_per_task:.2f}" if len(arms) > 1 else "-"
    figure = f"FIGURE write-cost connect {arms[0].cpu_per_task:.2f} submit {submit}"
    if a.record and len(arms) > 1:
        append_results(head, out, arms[0].note, f"`{figure}`")
    print(figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
