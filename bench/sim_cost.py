"""CPU per simulated schedule (issue 43): a baseline commit against the checkout, in the same run.

Issue 43 asks for at least 10,000 seeded schedules per CI run within 3 CPU-minutes on the 2-core
machine (about 18 ms of CPU a schedule). This runs the same ``--seeds`` schedules (spread evenly
over the CI's range ``[0, --span)``) of two trees of the simulator and the library: ``--base``, a
commit exported with ``git archive`` into a temp dir, and ``--head`` (``worktree``: the files as
they are; else a commit, exported the same way). Each arm runs in a fresh process
(``PYTHONHASHSEED=0``, its tree first on ``sys.path``), one schedule first to warm up, then the
seeds, timed with ``time.process_time`` (every thread of the process). The arms alternate for
``--rounds`` rounds (base first in odd rounds, head first in even ones), so both see the same load;
the figures are each arm's median over the rounds and the median of the rounds' ratios base/head
(each round's two arms ran back to back, under the same load).

Each child also prints every schedule's trace digest (:meth:`shardsink_dev.sim.world.Result.digest`):
the bench says whether both arms made the same requests in the same order for every seed (a change
that only makes schedules cheaper keeps them), and whether each arm's rounds agree (a seed replays
bit for bit). Appends a section to bench/RESULTS.md (``--no-record``: print only) and ends with::

    FIGURE sim-cost base <ms> head <ms> ratio <x> same-cpu-as-2500 <n> in-180-cpu-s <n>

(``same-cpu-as-2500``: the schedules, in steps of 500, that cost at head what the CI's 2,500 cost at
base in this run; ``in-180-cpu-s``: those that fit 3 CPU-minutes.)

Usage: ``python bench/sim_cost.py [--base REV] [--head worktree|REV] [--seeds 300] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKTREE = "worktree"
#: The commit before issue 43's work on the simulator's cost (2,500 CI schedules at ~67 ms each).
DEFAULT_BASE = "c16bda3"
#: The CPU budget of the simulator's CI test (3 CPU-minutes), and its schedules at the baseline.
BUDGET_S = 180.0
CI_BEFORE = 2500
CHILD = """
import json, sys, time
from shardsink_dev.sim.world import run_schedule
seeds = json.loads(sys.argv[1])
run_schedule(seeds[0])  # warm-up: imports, first-use caches
t0 = time.process_time()
digests = [run_schedule(s).digest() for s in seeds]
print(json.dumps({"cpu": time.process_time() - t0, "digests": digests}))
"""


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``plugins/`` and ``shardsink_dev/``) under ``into``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "plugins", "shardsink_dev"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def commit_of(rev: str) -> str:
    if rev == WORKTREE:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "plugins", "shardsink_dev"],
                               check=True, capture_output=True, text=True).stdout.strip()
        return f"{head} worktree" + (" (uncommitted changes)" if dirty else "")
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


def run_arm(tree: Path, seeds: list[int]) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{tree / 'plugins'}{os.pathsep}{tree}"}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(seeds)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    got: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return got


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default=DEFAULT_BASE, help=f"baseline commit (default {DEFAULT_BASE})")
    p.add_argument("--head", default=WORKTREE, help="'worktree' (the files as they are) or a commit")
    p.add_argument("--seeds", type=int, default=300, help="schedules per arm and round")
    p.add_argument("--span", type=int, default=2500, help="the seeds are spread over [0, span)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    a = p.parse_args()
    seeds = sorted({i * a.span // a.seeds for i in range(a.seeds)})
    started, load_before = datetime.datetime.now(datetime.UTC), load()
    cpu: dict[str, list[float]] = {"base": [], "head": []}
    digests: dict[str, list[list[str]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="sim-cost-") as tmp:
        trees = {"base": export(a.base, Path(tmp) / "base"),
                 "head": ROOT if a.head == WORKTREE else export(a.head, Path(tmp) / "head")}
        for r in range(a.rounds):
            for arm in ("base", "head") if r % 2 == 0 else ("head", "base"):
                got = run_arm(trees[arm], seeds)
                cpu[arm].append(float(got["cpu"]) / len(seeds) * 1000)  # type: ignore[arg-type]
                digests[arm].append(list(got["digests"]))  # type: ignore[call-overload]
                print(f"round {r + 1} {arm}: {cpu[arm][-1]:.1f} ms CPU per schedule (load {load()})", flush=True)
    base_ms, head_ms = statistics.median(cpu["base"]), statistics.median(cpu["head"])
    ratio = statistics.median(b / h for b, h in zip(cpu["base"], cpu["head"], strict=True))  # each round's pair
    same = sum(b == h for b, h in zip(digests["base"][0], digests["head"][0], strict=True))
    replays = all(d == digests[arm][0] for arm in digests for d in digests[arm])
    fits = int(BUDGET_S / (head_ms / 1000) // 500 * 500)
    before = CI_BEFORE * base_ms / 1000  # what the CI's 2,500 schedules cost at base, in this run
    same_cpu = int(before / (head_ms / 1000) // 500 * 500)
    lines = [
        f"## sim_cost ({started:%Y-%m-%d %H:%M} UTC, load before {load_before}, after {load()}, "
        f"{os.cpu_count()} cpus)",
        "",
        f"{len(seeds)} schedules (seeds spread over [0, {a.span})), {a.rounds} alternating rounds per arm, "
        "CPU (`time.process_time`, every thread) per schedule, median of the rounds:",
        "",
        "| arm | tree | ms CPU per schedule (rounds) |",
        "|---|---|---|",
        f"| base | {commit_of(a.base)} | {base_ms:.1f} ({', '.join(f'{x:.1f}' for x in cpu['base'])}) |",
        f"| head | {commit_of(a.head)} | {head_ms:.1f} ({', '.join(f'{x:.1f}' for x in cpu['head'])}) |",
        "",
        f"- base/head (median of the rounds' ratios): {ratio:.2f}x; {CI_BEFORE:,} schedules cost {before:.0f} "
        "CPU-s at base; at head the same CPU "
        f"holds {same_cpu:,} ({same_cpu * head_ms / 1000:.0f} CPU-s), {BUDGET_S:.0f} CPU-s hold {fits:,} "
        f"({fits * head_ms / 1000:.0f} CPU-s); 10,000 would take {10000 * head_ms / 1000:.0f} CPU-s",
        f"- same requests in the same order in both arms: {same} of {len(seeds)} seeds; "
        f"every round of each arm replayed the same traces: {'yes' if replays else 'NO'}",
        "",
        f"`FIGURE sim-cost base {base_ms:.1f} head {head_ms:.1f} ratio {ratio:.2f} same-cpu-as-2500 {same_cpu} "
        f"in-180-cpu-s {fits}`",
        "",
    ]
    print("\n".join(lines))
    if not a.no_record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
