"""The minimizer: a failing schedule's tape, shortened while it still fails the same way.

A schedule is its seed and its tape of choices (:mod:`shardsink_dev.sim.tape`); every choice's 0 is
the plain one, and a draw past the end of a replayed tape is 0. So, as Hypothesis shrinks a
choice sequence, :func:`shrink` tries smaller tapes, keeping one whenever the schedule it replays
still breaks the same invariant (:attr:`shardsink_dev.sim.world.Result.kind`): cut the tail, delete
spans, zero spans, then lower single choices, for as long as a pass still finds something and the
budget of replays lasts. "Smaller" is fewer non-zero choices, then a shorter tape: fewer actors,
no faults where none is needed, no hand-overs but those that matter.

Contract: the returned :class:`~shardsink_dev.sim.world.Result` fails with the same kind as the
one given, and replaying its ``choices`` with its seed reproduces it exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from shardsink_dev.sim.world import Result, run_schedule


def _size(choices: list[int]) -> tuple[int, int]:
    return sum(1 for c in choices if c), len(choices)


def shrink(failed: Result, *, budget: int = 400, run: Callable[[int, list[int]], Result] | None = None) -> Result:
    """The smallest failing schedule found within ``budget`` replays (module docstring)."""
    replay = run if run is not None else (lambda seed, tape: run_schedule(seed, replay=tape))
    best = failed
    tries = 0

    def attempt(tape: list[int]) -> bool:
        nonlocal best, tries
        if tries >= budget or _size(tape) >= _size(best.choices):
            return False
        tries += 1
        got = replay(failed.seed, tape)
        if got.kind == failed.kind and _size(got.choices) <= _size(best.choices):
            best = got
            return True
        return False

    improved = True
    while improved and tries < budget:
        improved = False
        cur = best.choices
        # the tail: a schedule's end is often not needed
        for cut in (len(cur) // 2, 3 * len(cur) // 4, 7 * len(cur) // 8):
            if attempt(cur[:cut]):
                improved, cur = True, best.choices
        span = max(1, len(cur) // 4)
        while span >= 1 and tries < budget:
            i = 0
            while i < len(best.choices) and tries < budget:
                cur = best.choices
                if attempt(cur[:i] + cur[i + span:]) or attempt(cur[:i] + [0] * len(cur[i:i + span]) + cur[i + span:]):
                    improved = True
                    continue
                i += span
            span //= 2
        for i in range(len(best.choices)):
            cur = best.choices
            if i < len(cur) and cur[i] > 1 and attempt([*cur[:i], cur[i] // 2, *cur[i + 1:]]):
                improved = True
    return best
