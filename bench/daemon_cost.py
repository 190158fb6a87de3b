"""What a Spark Connect session's Python costs the server: the worker fork server against a daemon
that imports its own modules (shardsink/spark/forkserver.py).

Each session is what a write session asks of the server's Python: the version check
(:func:`shardsink.spark.connect.probe`, one Python task) and one ``mapInArrow`` task over
``--rows`` rows with pyarrow work, in a fresh client process (a Connect client marks its whole
process as one), closed with ``stop()``. The server starts one Python worker daemon per session,
so its CPU per session is mostly that daemon's start-up.

Arms, each on a fresh local server (``shardsink_dev.connect``, its start and one warm-up session
not charged), alternating for ``--rounds`` rounds:

* **fork server** (the default): each daemon is forked from the JVM's fork server;
* **own imports** (the baseline: ``SHARDSINK_WORKER_FORKSERVER=off`` in the server's
  environment): each daemon imports pyarrow, pandas, pyspark's worker and shardsink itself, as
  every daemon did before the fork server.

Per arm: the server's process tree CPU per session (JVM, fork server, daemons, workers: by
process group as well, bench/proc_cpu.py ``tree_cpu``), and the wall per session. Prints the
head/base ratio, ends with ``FIGURE daemon-cost fork-server <CPU-s> own-imports <CPU-s> ratio <r>``;
``--record`` appends the table to bench/RESULTS.md.

    python bench/daemon_cost.py [--sessions 10] [--rounds 2] [--rows 300] [--record]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _path  # noqa: F401  (repo root on sys.path)
from proc_cpu import tree_cpu

from shardsink.spark.forkserver import SWITCH
from shardsink_dev.connect import connect_server, python_env

RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
SESSION = """
import sys, pyarrow as pa, pyarrow.compute as pc
from shardsink.spark.connect import connect_session, probe

def work(batches):
    for b in batches:
        yield pa.RecordBatch.from_pydict({"id": b.column("id"), "v": pc.multiply(b.column("id"), 2)})

with connect_session(sys.argv[1], name="shardsink-daemon-cost") as spark:
    probe(spark)
    rows = spark.range(int(sys.argv[2]), numPartitions=1).mapInArrow(work, "id long, v long").count()
    assert rows == int(sys.argv[2]), rows
"""
ARMS = {"fork server": {}, "own imports": {SWITCH: "off"}}


def run_arm(name: str, folder: Path, sessions: int, rows: int) -> tuple[float, float]:
    """(server CPU-s per session, wall s per session) of ``sessions`` sessions on a fresh server."""
    env = python_env(dict(os.environ, **ARMS[name]))
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "session.py"
    script.write_text(SESSION)
    with connect_server(folder=folder / name.replace(" ", "-"), env=env) as server:
        assert server.proc is not None

        def session() -> None:
            r = subprocess.run([sys.executable, str(script), server.url, str(rows)], env=env,
                               capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"a session failed ({name}):\n{r.stderr[-3000:]}")

        session()  # warm-up: the server's first Python task, the JIT (not charged)
        c0, t0 = tree_cpu(server.proc.pid), time.monotonic()
        for _ in range(sessions):
            session()
        cpu, wall = tree_cpu(server.proc.pid) - c0, time.monotonic() - t0
    return cpu / sessions, wall / sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    if not (1 <= a.sessions <= 200 and 1 <= a.rounds <= 10 and 1 <= a.rows <= 10_000_000):
        raise SystemExit(f"--sessions 1..200, --rounds 1..10, --rows 1..10000000: "
                         f"got {a.sessions}, {a.rounds}, {a.rows}")
    load0 = os.getloadavg()
    got: dict[str, list[tuple[float, float]]] = {n: [] for n in ARMS}
    with tempfile.TemporaryDirectory(prefix="shardsink-daemon-cost-") as tmp:
        for r in range(a.rounds):
            for name in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):
                cpu, wall = run_arm(name, Path(tmp) / f"r{r}", a.sessions, a.rows)
                got[name].append((cpu, wall))
                print(f"round {r + 1} {name}: {cpu:.2f} CPU-s and {wall:.2f} s per session", flush=True)
    load1 = os.getloadavg()
    med = {n: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for n, v in got.items()}
    head, base = med["fork server"], med["own imports"]
    lines = ["| arm | server CPU-s per session (rounds) | wall s per session (rounds) |", "|---|---|---|"]
    for n, v in got.items():
        lines.append(f"| {n} | {med[n][0]:.2f} ({', '.join(f'{c:.2f}' for c, _ in v)}) | "
                     f"{med[n][1]:.2f} ({', '.join(f'{w:.2f}' for _, w in v)}) |")
    figure = f"FIGURE daemon-cost fork-server {head[0]:.2f} own-imports {base[0]:.2f} ratio {head[0] / base[0]:.2f}"
    text = (f"\n## daemon_cost ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load before "
            f"{load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, after {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}, "
            f"{platform.machine()}, {os.cpu_count()} cpus; {a.sessions} sessions of {a.rows} rows "
            "per arm and round)\n\n"
            + "\n".join(lines) + f"\n\n- fork server / own imports: CPU {head[0] / base[0]:.2f}x, "
            f"wall {head[1] / base[1]:.2f}x\n\n`{figure}`\n")
    print(text)
    if a.record:
        with RESULTS_MD.open("a") as fh:
            fh.write(text)
    print(figure)


if __name__ == "__main__":
    main()
