"""``python -m shardsink_dev.sim``: run simulated schedules (``make sim``).

::

    make sim                      # SEEDS (default 10000) schedules from seed 0, then one FIGURE line
    make sim SEEDS=200000         # a long soak
    make sim SEED=1234            # replay one schedule, printing its steps
    make sim SEED=1234 TAPE=f     # replay the (shrunk) tape a failure saved to f
    make sim PLANT=seal-at-commit # with a fixed defect re-introduced (shardsink_dev.sim.planted)

A failure prints its seed, the invariant it broke and at which step, the one-line command that
replays it, and the schedule shrunk to its essential steps (:mod:`shardsink_dev.sim.shrink`; its
tape is saved so that it replays too). The run ends with one line::

    FIGURE sim <schedules> schedules <failures> failures <seconds> s

(seconds of CPU). Exit status 0 when no schedule failed (with ``--plant``: when one did, which is
what a planted defect must do). The simulator's own inputs are pinned (``PYTHONHASHSEED=0``) so a
seed replays the same from the command line as from the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from shardsink_dev.sim.planted import DEFECTS, planted
from shardsink_dev.sim.shrink import shrink
from shardsink_dev.sim.world import Result, run_schedule


def replay_command(seed: int, plant: str | None, tape: str | None = None) -> str:
    """The one line that replays a schedule."""
    return " ".join(["make sim", f"SEED={seed}", *([f"PLANT={plant}"] if plant else []),
                     *([f"TAPE={tape}"] if tape else [])])


def report(r: Result, plant: str | None, *, shrink_budget: int) -> None:
    """Print a failure: seed, invariant, step, replay command; then its shrunk schedule."""
    print(f"FAILED seed {r.seed} at step {r.steps}: {r.message}")
    print(f"  replay: {replay_command(r.seed, plant)}")
    if shrink_budget <= 0:
        return
    small = shrink(r, budget=shrink_budget)
    fd, path = tempfile.mkstemp(prefix=f"sim-{r.seed}-", suffix=".tape.json")
    with os.fdopen(fd, "w") as f:
        json.dump(small.choices, f)
    steps = [s for s in small.trace if " end " not in s]
    print(f"  shrunk to {small.steps} steps ({sum(1 for c in small.choices if c)} non-plain choices), "
          f"replay: {replay_command(r.seed, plant, path)}")
    for line in steps if len(steps) <= 80 else steps[-60:]:
        print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsink_dev.sim", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, help="replay this one schedule, printing every step")
    p.add_argument("--tape", help="with --seed: replay the choices saved in this file")
    p.add_argument("--seeds", type=int, default=10000, help="run this many schedules")
    p.add_argument("--start", type=int, default=0, help="the first seed")
    p.add_argument("--plant", choices=sorted(DEFECTS), help="re-introduce a fixed defect")
    p.add_argument("--first", action="store_true", help="stop at the first failure")
    p.add_argument("--shrink", type=int, default=300, help="replays the minimizer may spend per failure")
    a = p.parse_args(argv)
    t0 = time.process_time()
    runs = failures = 0
    with planted(a.plant):
        if a.seed is not None:
            tape = None
            if a.tape:
                with open(a.tape) as f:
                    tape = json.load(f)
            r = run_schedule(a.seed, replay=tape)
            print("\n".join(r.trace))
            runs, failures = 1, int(r.failed)
            if r.failed:
                report(r, a.plant, shrink_budget=0)
        else:
            for seed in range(a.start, a.start + a.seeds):
                r = run_schedule(seed)
                runs += 1
                if r.failed:
                    failures += 1
                    report(r, a.plant, shrink_budget=a.shrink if failures <= 3 else 0)
                    if a.first:
                        break
    print(f"FIGURE sim {runs} schedules {failures} failures {time.process_time() - t0:.0f} s")
    return int(bool(failures) != bool(a.plant))


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # pin hashing, then run again as this same command
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "shardsink_dev.sim", *sys.argv[1:]])
    sys.exit(main())
