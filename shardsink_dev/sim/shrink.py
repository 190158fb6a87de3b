"""The minimizer: a failing schedule's tape, shortened while it still fails the same way.

A schedule is its seed and its tape of choices (:mod:`shardsink_dev.sim.tape`); every choice's 0 is
the plain one, and a draw past the end of a replayed tape is 0. So, as Hypothesis shrinks a
choice sequence, :func:`shrink` tries smaller tapes, keeping one whenever the schedule it replays
still breaks the same invariant (:attr:`shardsink_dev.sim.world.Result.kind`): zero the plan's
choices one by one (which actors, which faults), then zero or delete spans of the tape, halving
their length, for as long as a pass still finds something and the budget of replays lasts.
"Smaller" is fewer store requests, then fewer non-plain choices, then a shorter tape: fewer
actors, no faults where none is needed, no hand-overs but those that matter.

Contract: the returned :class:`~shardsink_dev.sim.world.Result` fails with the same kind as the
one given, and replaying its ``choices`` with its seed reproduces it exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from shardsink_dev.sim.tape import Tape
from shardsink_dev.sim.world import Result, draw_plan, run_schedule


def _size(r: Result) -> tuple[int, int, int]:
    """Smaller is better: fewer store requests, then fewer non-plain choices, then a shorter tape."""
    return r.steps, sum(1 for c in r.choices if c), len(r.choices)


def _spans(n: int) -> list[int]:
    """Span lengths to try, largest first: n/2, n/4, ..., 1."""
    out, k = [], max(1, n // 2)
    while k >= 1:
        out.append(k)
        k //= 2
    return out


def shrink(failed: Result, *, budget: int = 400, run: Callable[[int, list[int]], Result] | None = None) -> Result:
    """The smallest failing schedule found within ``budget`` replays (module docstring)."""
    replay = run if run is not None else (lambda seed, tape: run_schedule(seed, replay=tape))
    best = failed
    tries = 0

    def attempt(tape: list[int]) -> bool:
        nonlocal best, tries
        if tries >= budget or tape == best.choices:
            return False
        tries += 1
        got = replay(failed.seed, tape)
        if got.kind == failed.kind and _size(got) < _size(best):
            best = got
            return True
        return False

    plan = _plan_length()
    improved = True
    while improved and tries < budget:
        improved = False
        for i in range(min(plan, len(best.choices))):  # the plan first: fewer actors, no faults
            cur = best.choices
            if cur[i] and attempt([*cur[:i], 0, *cur[i + 1:]]):
                improved = True
        for span in _spans(len(best.choices)):
            i = 0
            while i < len(best.choices) and tries < budget:
                cur = best.choices
                zeroed = any(cur[i:i + span]) and attempt(cur[:i] + [0] * len(cur[i:i + span]) + cur[i + span:])
                if zeroed or attempt(cur[:i] + cur[i + span:]):
                    improved = True
                else:
                    i += span
    return best


def _plan_length() -> int:
    """How many choices a schedule's plan takes (its first draws)."""
    tape = Tape(0)
    draw_plan(tape)
    return len(tape.choices)
