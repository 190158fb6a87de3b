"""The choice tape: every decision of one simulated schedule, drawn from one seed, replayable.

A schedule draws all its choices through one :class:`Tape`: the world's plan (which runs, which
maintenance, which faults and at what rates) and, at every store request, the scheduler's
(whether to hand the baton over and to whom, whether the caller crashes, how the request ends,
how far the clock moves). Drawn from a seed, the tape records them; replayed from a recorded
list, it gives them back (a draw past the end gives 0). Every choice is laid out so that 0 is the
plain one (stay, no crash, ``ok``, the smallest tick, the fewest actors), so the minimizer
(:mod:`shardsink_dev.sim.shrink`) shortens a failing schedule by deleting and zeroing choices, as
Hypothesis shrinks its choice sequences.

Contract: a tape replayed from ``choices`` makes the same draws as the run that recorded them
(bit for bit, with the same seed for identifiers and jitter, :mod:`shardsink_dev.sim.sched`), so a
recorded schedule replays exactly, and a shrunk one is a valid schedule of its own.
"""

from __future__ import annotations

import random


class Tape:
    """Draws integers from a seed (recording them) or replays a recorded list."""

    def __init__(self, seed: int, replay: list[int] | None = None) -> None:
        self._rng = random.Random(seed)
        self._bits = self._rng.getrandbits
        self._replay = replay
        self.choices: list[int] = []

    def draw(self, n: int) -> int:
        """An integer in ``[0, n)`` (``n >= 1``): ``Random.randrange(n)``'s value, drawn as it draws
        it (``_randbelow_with_getrandbits``: ``n.bit_length()`` bits until one is below ``n``),
        without its argument checks (a draw per request adds up over thousands of schedules)."""
        if n <= 1:
            v = 0
        elif self._replay is None:
            k = n.bit_length()
            v = self._bits(k)
            while v >= n:
                v = self._bits(k)
        else:
            i = len(self.choices)
            v = min(self._replay[i], n - 1) if i < len(self._replay) else 0
        self.choices.append(v)
        return v

    def chance(self, per_mille: int) -> bool:
        """True with probability ``per_mille / 1000`` (drawn from the top: 0 is always False).
        The draw is :meth:`draw`'s ``draw(1000)``, inlined when drawing from the seed (it is
        most of the tape's draws)."""
        if per_mille <= 0:
            return False
        if self._replay is not None:
            return self.draw(1000) >= 1000 - per_mille
        v = self._bits(10)  # 1000 .bit_length()
        while v >= 1000:
            v = self._bits(10)
        self.choices.append(v)
        return v >= 1000 - per_mille

    def pick(self, options: tuple[float, ...] | list[float]) -> float:
        """One of ``options`` (the first is the plain one)."""
        return options[self.draw(len(options))]
