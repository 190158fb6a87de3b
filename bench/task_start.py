"""CPU of an Airflow task process before its task starts: a baseline commit against the checkout.

Every Airflow task process loads the plugins (for their listeners and macros, as
``airflow.sdk.execution_time.task_runner`` does) and parses the DAG file. Two ways, each measured:

* **fresh**: a new interpreter (a ``dags test`` runner, a Kubernetes pod, any Airflow command);
* **forked**: on Linux the Celery and local executors fork the task from a worker process that
  already imported Airflow (and what Airflow's provider discovery imported: shardsink's
  ``get_provider_info`` imports the package). Here a parent imports what a Celery pool process
  holds, with shardsink's preload (:mod:`shardsink.airflow.celery_config`), and forks ``--forks``
  tasks; each also builds a pyarrow array from Python values, as the mint, the append and a
  Connect write do (pyarrow then imports pandas if nobody has).

With a backfill's tens of task processes on two cores, that start-up is part of the CPU floor of
issue 45's ratios. This runs the same start-ups for two trees of ``plugins/``: ``--base``, a
commit exported with ``git archive``, and the checkout (``worktree``), each first on
``sys.path``, in the bench's AIRFLOW_HOME, examples off. The arms alternate for ``--rounds``
rounds, base first in odd rounds. The figures are medians of the CPU (user + sys, from
``RUSAGE_CHILDREN``) of each start-up, and of the fresh ones' wall.

Appends a section to bench/RESULTS.md (``--no-record``: print only) and ends with::

    FIGURE task-start fresh base <CPU-s> head <CPU-s> forked base <CPU-s> head <CPU-s>

Usage: ``python bench/task_start.py [--base REV] [--dag dags/example_ingest.py] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_cost import export
from write_cost import append_results, children_cpu, section_head

ROOT = Path(__file__).resolve().parent.parent
#: The commit before the plugin stopped building the Shards page's app at import.
DEFAULT_BASE = "7f39b67"
CHILD = """
import importlib.util, sys
from airflow.sdk.execution_time import task_runner  # noqa: F401  (what the task process runs)
from airflow.sdk.listener import get_listener_manager
from airflow.sdk.plugins_manager import integrate_macros_plugins
get_listener_manager()
integrate_macros_plugins()
spec = importlib.util.spec_from_file_location("bench_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
"""
FORKED = """
import importlib.util, json, os, resource, sys
import airflow.configuration  # noqa: F401  (a Celery pool process's imports before it forks a task)
import airflow.providers.celery.executors.celery_executor_utils  # noqa: F401
from airflow.sdk.execution_time import supervisor  # noqa: F401
from shardsink.airflow.celery_config import PRELOAD  # the worker's Celery ``imports`` (docker-compose sets it)
for name in PRELOAD:
    importlib.import_module(name)


def task():
    from airflow.sdk.execution_time import task_runner  # noqa: F401
    from airflow.sdk.listener import get_listener_manager
    from airflow.sdk.plugins_manager import integrate_macros_plugins
    get_listener_manager()
    integrate_macros_plugins()
    spec = importlib.util.spec_from_file_location("bench_dag", sys.argv[1])
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import pyarrow as pa
    pa.array([1, 2])


cpu = []
for _ in range(int(sys.argv[2])):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        task()
        os._exit(0)
    os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
print(json.dumps(cpu))
"""


def _env(plugins: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)]), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "no-plugins"),
           "PYTHONWARNINGS": "ignore"}


def start_once(plugins: Path, dag: Path, home: Path) -> tuple[float, float]:
    """One fresh task process's start-up on the tree ``plugins``: (CPU-s, wall s)."""
    env = _env(plugins, home)
    cpu0, t0 = children_cpu(), time.monotonic()
    r = subprocess.run([sys.executable, "-c", CHILD, str(dag)], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"the start-up failed on {plugins}: {r.stderr[-2000:]}")
    return children_cpu() - cpu0, time.monotonic() - t0


def forked(plugins: Path, dag: Path, home: Path, forks: int) -> list[float]:
    """The CPU-s of each of ``forks`` task start-ups forked from one worker-like parent."""
    r = subprocess.run([sys.executable, "-c", FORKED, str(dag), str(forks)], env=_env(plugins, home),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"the forked start-ups failed on {plugins}: {r.stderr[-2000:]}")
    return [float(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=DEFAULT_BASE)
    ap.add_argument("--dag", default="dags/example_ingest.py")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--forks", type=int, default=3)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    load = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "head": []}
    forks: dict[str, list[float]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="task-start-") as tmp:
        trees = {"base": export(a.base, Path(tmp) / "base") / "plugins", "head": ROOT / "plugins"}
        home = Path(tmp) / "home"
        home.mkdir()
        dag = (ROOT / a.dag).resolve()
        start_once(trees["head"], dag, home)  # warm the bytecode caches of both before measuring
        start_once(trees["base"], dag, home)
        for i in range(a.rounds):
            for arm in ("base", "head") if i % 2 == 0 else ("head", "base"):
                runs[arm].append(start_once(trees[arm], dag, home))
                forks[arm] += forked(trees[arm], dag, home, a.forks)
    cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
    fork = {k: statistics.median(v) for k, v in forks.items()}
    after = os.getloadavg()
    table = "\n".join([
        f"| task process start-up ({a.dag}, {a.rounds} rounds) | fresh: CPU-s median | fresh: wall median "
        f"| forked ({a.forks} a round): CPU-s median |",
        "|---|---|---|---|",
        f"| base {a.base} | {cpu['base']:.2f} | {wall['base']:.2f} s | {fork['base']:.2f} |",
        f"| head (worktree) | {cpu['head']:.2f} | {wall['head']:.2f} s | {fork['head']:.2f} |"])
    figure = (f"FIGURE task-start fresh base {cpu['base']:.2f} head {cpu['head']:.2f} "
              f"forked base {fork['base']:.2f} head {fork['head']:.2f}")
    print(table)
    print(figure)
    if not a.no_record:
        append_results(section_head("task_start", load, after), table, f"`{figure}`")


if __name__ == "__main__":
    main()
