"""CPU of an Airflow task process before its task starts: a baseline commit against the checkout.

Every Airflow task process (a Celery or local executor's, a ``dags test`` run's first task) starts a
Python interpreter, loads the plugins (for their listeners and macros, as
``airflow.sdk.execution_time.task_runner`` does) and parses the DAG file. With a backfill's tens of
task processes on two cores, that start-up is part of the CPU floor of issue 45's ratios. This
runs the same start-up for two trees of ``plugins/``: ``--base``, a commit exported with ``git
archive``, and the checkout (``worktree``). Each arm is a fresh interpreter (its tree first on
``sys.path``, the AIRFLOW_HOME of the bench, examples off); the arms alternate for ``--rounds``
rounds, base first in odd rounds. The figure is the whole process's CPU (user + sys of the child,
from ``RUSAGE_CHILDREN``) and its wall, medians over the rounds, and the median of the rounds'
ratios.

Appends a section to bench/RESULTS.md (``--no-record``: print only) and ends with::

    FIGURE task-start base <CPU-s> head <CPU-s> ratio <x>

Usage: ``python bench/task_start.py [--base REV] [--dag dags/example_ingest.py] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from write_cost import append_results, section_head

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


def export(rev: str, into: Path) -> Path:
    """``plugins/`` of ``rev`` under ``into``."""
    data = subprocess.run(["git", "archive", rev, "plugins"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "plugins"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start_once(plugins: Path, dag: Path, home: Path) -> tuple[float, float]:
    """One task process's start-up on the tree ``plugins``: (CPU-s, wall s)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)]), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "no-plugins"),
           "PYTHONWARNINGS": "ignore"}
    cpu0, t0 = children_cpu(), time.monotonic()
    r = subprocess.run([sys.executable, "-c", CHILD, str(dag)], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"the start-up failed on {plugins}: {r.stderr[-2000:]}")
    return children_cpu() - cpu0, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=DEFAULT_BASE)
    ap.add_argument("--dag", default="dags/example_ingest.py")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    load = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="task-start-") as tmp:
        trees = {"base": export(a.base, Path(tmp) / "base"), "head": ROOT / "plugins"}
        home = Path(tmp) / "home"
        home.mkdir()
        dag = (ROOT / a.dag).resolve()
        start_once(trees["head"], dag, home)  # warm the bytecode caches of both before measuring
        start_once(trees["base"], dag, home)
        for i in range(a.rounds):
            for arm in ("base", "head") if i % 2 == 0 else ("head", "base"):
                runs[arm].append(start_once(trees[arm], dag, home))
    cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
    ratio = statistics.median(b[0] / h[0] for b, h in zip(runs["base"], runs["head"], strict=True))
    after = os.getloadavg()
    table = "\n".join([
        f"| task process start-up ({a.dag}, {a.rounds} rounds) | CPU-s median | wall median |",
        "|---|---|---|",
        f"| base {a.base} | {cpu['base']:.2f} | {wall['base']:.2f} s |",
        f"| head (worktree) | {cpu['head']:.2f} | {wall['head']:.2f} s |"])
    figure = f"FIGURE task-start base {cpu['base']:.2f} head {cpu['head']:.2f} ratio {ratio:.2f}"
    print(table)
    print(figure)
    if not a.no_record:
        append_results(section_head("task_start", load, after), table, f"`{figure}`")


if __name__ == "__main__":
    main()
