"""The suite's time and where its CPU goes: ``make test`` with every process's CPU sampled beside it.

The budget is 25 minutes on 2 cores, and the suite is CPU-bound (its cores are ~95% busy), so its
wall is about its CPU over two: a minute saved is two CPU-minutes cut, or idle time filled. This
runs a command (default ``make test``), samples ``/proc/<pid>/stat`` of every process every 2 s
and ``/proc/stat`` every 30 s, and reports: the wall, each pytest process's own summary line (the
rest and the two groups), the busy share of the cores, and CPU seconds by kind of process (Spark
JVMs, Python workers, pytest, warm ``airflow dags test`` runners, moto, the topology's daemons...).

A process started during the run counts whole; one older than the run, from the run's start. A
process that lives less than the 2 s between samples may be missed (only what the sampler saw is
attributed); the busy share from ``/proc/stat`` counts everything. The command's whole output
goes to bench/results/suite_time.log. Appends the figures to bench/RESULTS.md (not with
``--command``, which is for trying the sampler).

    python bench/suite_time.py [--command "make test"]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import threading
import time
from pathlib import Path

from proc_cpu import machine_jiffies

TICK = os.sysconf("SC_CLK_TCK")
RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
LOG = Path(__file__).resolve().parent / "results" / "suite_time.log"
#: Process kinds, first match wins: (name, substrings of the command line, any of them).
KINDS = (
    ("Spark executor JVMs", ("CoarseGrainedExecutorBackend",)),
    ("Spark master/worker JVMs", ("deploy.master.Master", "deploy.worker.Worker")),
    ("other JVMs (drivers, test sessions)", ("/bin/java",)),
    ("Spark's Python workers", ("pyspark.daemon", "shardsink.spark.daemon", "shardsink.spark.forkserver")),
    ("pytest processes", ("pytest",)), ("warm `airflow dags test` runners", ("dagrunner",)),
    ("moto", ("moto",)), ("spark-submit'ed job drivers (Python)", ("spark_jobs",)),
    ("Airflow scheduler, api-server, triggerer, dag-processor",
     ("airflow scheduler", "airflow api-server", "airflow triggerer", "airflow dag-processor")),
    ("Celery workers", ("celery",)), ("Airflow CLI and task processes", ("airflow",)), ("PostgreSQL", ("postgres",)),
    ("Chromium", ("chromium",)), ("shardsink CLI", ("shardsink",)),
)


class Sampler:
    """CPU seconds per process (keyed by pid and start time) since it was first seen."""

    def __init__(self) -> None:
        self.first: dict[tuple[int, str], float] = {}
        self.last: dict[tuple[int, str], float] = {}
        self.cmd: dict[tuple[int, str], str] = {}
        self.test: dict[tuple[int, str], str] = {}
        self.stop = threading.Event()

    def sample(self) -> None:
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                raw = Path(f"/proc/{p}/stat").read_text()
                f = raw[raw.rindex(")") + 2:].split()
                key, cpu = (int(p), f[19]), (int(f[11]) + int(f[12])) / TICK
                if key not in self.first:
                    self.first[key] = 0.0  # started during the run: all its CPU is the run's
                    cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.cmd[key] = cmd
                    self.test[key] = _spawning_test(int(p))
                self.last[key] = cpu
            except (OSError, ValueError, IndexError):
                continue

    def run(self) -> None:
        while not self.stop.wait(2.0):
            self.sample()

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, cpu in self.last.items():
            cmd = self.cmd.get(key, "")
            kind = next((name for name, needles in KINDS if any(n in cmd for n in needles)), "other")
            out[kind] = out.get(kind, 0.0) + cpu - self.first[key]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


    def by_test(self) -> dict[str, float]:
        """CPU of the processes each test module spawned (not pytest's own: see ``_spawning_test``)."""
        out: dict[str, float] = {}
        for key, cpu in self.last.items():
            if test := self.test.get(key):
                out[test] = out.get(test, 0.0) + cpu - self.first[key]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _spawning_test(pid: int) -> str:
    """The test module during which ``pid`` was exec'd, from the ``PYTEST_CURRENT_TEST`` it inherited.

    A process's environ is the one it was exec'd with: a child of a test has the test's name; a
    process forked from an older one (a warm ``dags test`` runner's fork, a Celery task) has its
    parent's; pytest's own processes have none, so their CPU is in no module's figure.
    """
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    for var in env:
        if var.startswith(b"PYTEST_CURRENT_TEST="):
            return var.split(b"=", 1)[1].decode(errors="replace").split("::", 1)[0]
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--command", default=None, help="another command than `make test` (nothing is appended)")
    args = ap.parse_args()
    command = args.command or "make test"
    repo = Path(__file__).resolve().parents[1]
    sampler = Sampler()
    sampler.sample()
    sampler.first.update(sampler.last)  # a process older than the run: only its CPU from now on counts
    thread = threading.Thread(target=sampler.run, daemon=True)
    tot0, idle0, t0, load0 = *machine_jiffies(), time.monotonic(), os.getloadavg()
    thread.start()
    out = subprocess.run(command, shell=True, cwd=repo, capture_output=True, text=True)
    wall = time.monotonic() - t0
    LOG.parent.mkdir(exist_ok=True)
    LOG.write_text(out.stdout + out.stderr)  # the suite's whole output, for a failure's details
    sampler.stop.set()
    thread.join()
    sampler.sample()
    tot1, idle1 = machine_jiffies()
    busy = (tot1 - tot0 - (idle1 - idle0)) / TICK
    summaries = re.findall(r"^=*\s*(\d+ (?:passed|failed).*? in [\d.]+s.*?)\s*=*$", out.stdout, re.M)
    kinds = sampler.by_kind()
    lines = [f"| wall | {int(wall // 60)}:{wall % 60:02.0f} (exit {out.returncode}) |",
             f"| pytest processes (the rest, group 1, group 2) | {'; '.join(summaries) or '-'} |",
             f"| cores busy | {busy:.0f} of {(tot1 - tot0) / TICK:.0f} core-seconds "
             f"({100 * busy / max((tot1 - tot0) / TICK, 1e-9):.0f}%) |",
             *(f"| CPU: {k} | {v:.0f} s |" for k, v in kinds.items() if v >= 1),
             *(f"| CPU of processes spawned in {k} | {v:.0f} s |"
               for k, v in list(sampler.by_test().items())[:25] if v >= 5)]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                         text=True).stdout.strip()
    text = (f"\n## suite_time ({time.strftime('%Y-%m-%d %H:%M')}, `{command}` at {rev}, load before "
            f"{load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, {platform.machine()}, {os.cpu_count()} cpus)\n\n"
            "| what | figure |\n|---|---|\n" + "\n".join(lines) + "\n")
    print(text)
    if args.command is None:
        with RESULTS_MD.open("a") as fh:
            fh.write(text)
    print(f"FIGURE suite_time wall {wall:.0f} s busy {100 * busy / max((tot1 - tot0) / TICK, 1e-9):.0f}%")


if __name__ == "__main__":
    main()
