"""The baton scheduler: actors run the real library as coroutines, exactly one at a time.

Each actor (an Airflow task try, a maintenance pass, the landing zone's producer) runs in its own
greenlet (a stack of its own in the caller's thread, switched to explicitly: a hand-over is a
stack switch, not two OS threads waking each other) and holds the *baton* while it runs. Every
store request it makes passes :meth:`Scheduler.request` first (the world's gate,
:mod:`shardsink_dev.sim.store`), which draws from the schedule's tape (:mod:`shardsink_dev.sim.tape`):

1. how far the simulated clock moves (a tick);
2. whether the caller crashes here (:class:`Crash`: the actor stops between two store calls, as a
   killed process would; every later request of it raises again, so no ``finally`` of the library
   reaches the store);
3. whether it hands the baton to another ready actor (and to which), and waits to get it back;
4. how the request ends (:data:`shardsink_dev.sim.store.Outcome`, at the schedule's rates).

Actors may start later (``delay``: an Airflow retry's backoff, a deferred append's next poke):
when no actor is ready the clock jumps to the earliest start. An actor's end runs its ``on_end``
while it still holds the baton (the world spawns a retry, the next task, or records a result).

Contract: with the same tape choices and seed, a schedule makes the same requests in the same
order (:attr:`Scheduler.trace`), so it replays bit for bit. A :class:`Violation` (an invariant
broken, raised by the checker wherever it is detected) stops every actor at its next request and is
what :meth:`Scheduler.run` reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet

from shardsink_dev.sim.store import WRITES, Outcome, SimClock
from shardsink_dev.sim.tape import Tape

#: Clock ticks a request may take (seconds; the first is the plain one).
TICKS = (0.05, 0.3, 0.7, 2.0)
#: Requests a storm lasts.
STORM = 12


class Crash(BaseException):
    """The actor stops here (its process was killed); BaseException so no library handler takes it."""


class Violation(BaseException):
    """An invariant is broken. ``kind`` names which (the minimizer keeps schedules failing the same way)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class Rates:
    """Per-mille chances per request: hand the baton over, crash the caller, the three outcomes
    other than ``ok`` (failed; timed out, not performed; performed, reported timed out), and a
    *storm*: the store unreachable for the next ``STORM`` requests, whoever sends them (reads
    fail, writes time out unperformed), so retries and re-reads fail too."""

    switch: int = 0
    crash: int = 0
    failed: int = 0
    lost: int = 0
    performed: int = 0
    storm: int = 0


class Actor:
    """One process of the world: ``body`` runs holding the baton (its value kept as ``result``);
    ``on_end(actor)`` after it."""

    def __init__(self, sched: Scheduler, name: str, body: Callable[[], Any], *, start_at: float, crashable: bool,
                 on_end: Callable[[Actor], None] | None) -> None:
        self.sched, self.name, self.body = sched, name, body
        self.start_at, self.crashable, self.on_end = start_at, crashable, on_end
        self.glet: greenlet | None = None  # its coroutine, once it first held the baton
        self.finished = False
        self.dead = False  # crashed: every later request raises Crash
        #: What the body raised (None: it returned); a Crash when it was killed.
        self.error: BaseException | None = None
        self.result: Any = None
        #: What the actor's process holds in memory (each actor is a process of its own).
        self.process: dict[str, Any] = {}

    def main(self) -> None:
        try:
            if self.sched.failure is not None:
                raise Crash()
            self.result = self.body()
        except BaseException as e:  # the world's on_end judges what the body raised
            self.error = e
        if not self.sched.stopping:
            self.sched.ended(self)


class Scheduler:
    """The gate every request passes; runs actors one at a time (see the module docstring)."""

    def __init__(self, tape: Tape, clock: SimClock, rates: Rates, *, max_steps: int = 4000) -> None:
        self.tape, self.clock, self.rates, self.max_steps = tape, clock, rates, max_steps
        self.actors: list[Actor] = []
        #: The actors not finished yet, in spawn order (what :meth:`_ready` filters).
        self.live: list[Actor] = []
        self.current: Actor | None = None
        self.steps = 0
        self.trace: list[str] = []
        self.failure: Violation | None = None
        self.storm = 0  # requests of the current storm still to come
        #: Called with the actor about to hold the baton (the world swaps in its process's memory).
        self.on_resume: Callable[[Actor], None] | None = None
        self._then: Actor | None = None  # who holds the baton after the actor that just ended
        self._loop: greenlet | None = None  # :meth:`run`'s coroutine, every actor's parent
        #: An error escaped the run: the actors left suspended are being unwound (:meth:`_unwind`).
        self.stopping = False

    # --- actors -----------------------------------------------------------------------------

    def spawn(self, name: str, body: Callable[[], Any], *, delay: float = 0.0, crashable: bool = True,
              on_end: Callable[[Actor], None] | None = None) -> Actor:
        """A new actor, ready at ``now + delay``."""
        a = Actor(self, name, body, start_at=self.clock.now + delay, crashable=crashable, on_end=on_end)
        self.actors.append(a)
        self.live.append(a)
        return a

    def fail(self, v: Violation) -> Violation:
        """Record the first violation (every actor then stops at its next request); returns it."""
        if self.failure is None:
            self.failure = v
            self.trace.append(f"{self.steps} VIOLATION {v}")
        return v

    def run(self) -> None:
        """Run every actor (and those they spawn) to its end: each actor's coroutine returns here
        when its body ends (its parent), and the baton goes to the one :meth:`ended` chose."""
        self._loop = getcurrent()
        try:
            nxt = self._next()
            while nxt is not None:
                self._then = None
                self._resume(nxt)
                nxt = self._then
        finally:
            self._unwind()
            self.current = None

    def _unwind(self) -> None:
        """Stop the actors an error escaping the run left suspended, now, while the world is still
        this schedule's: each is killed (its ``finally`` blocks' requests raise Crash), never judged.
        A suspended coroutine left to the garbage collector would run them later, in whatever
        schedule is running then, drawing from its identifiers and jitter."""
        self.stopping = True
        for a in self.actors:
            if a.glet is not None and not a.glet.dead:
                a.dead, self.current = True, a
                a.glet.throw(GreenletExit)

    def _ready(self, but: Actor | None = None) -> list[Actor]:
        now = self.clock.now
        return [a for a in self.live if a is not but and a.start_at <= now]

    def _next(self) -> Actor | None:
        """The next actor to run (tape-chosen among the ready; the clock jumps to a later start)."""
        ready = self._ready()
        if not ready:
            if not self.live:
                return None
            self.clock.advance(min(a.start_at for a in self.live) - self.clock.now)
            ready = self._ready()
        return ready[self.tape.draw(len(ready))]

    def _resume(self, a: Actor) -> None:
        """Hand the baton to ``a``: returns when it is handed back to the caller (to the run's
        loop: when an actor ended)."""
        self.current = a
        if self.on_resume is not None:
            self.on_resume(a)
        if a.glet is None:
            a.glet = greenlet(a.main, parent=self._loop)
        a.glet.switch()

    def ended(self, a: Actor) -> None:
        """Called in ``a``'s coroutine as its body ends: its ``on_end``, then who holds the baton next."""
        a.finished = True
        self.live.remove(a)
        self.trace.append(f"{self.steps} {a.name} end {type(a.error).__name__ if a.error else 'ok'}")
        if a.on_end is not None and self.failure is None:
            try:
                a.on_end(a)
            except Violation as v:
                self.fail(v)
        self._then = self._next() if self.failure is None else next(iter(self.live), None)

    # --- the gate ---------------------------------------------------------------------------

    def request(self, method: str, where: str) -> Outcome:
        """Tick, maybe crash the caller, maybe hand the baton over; then the request's outcome."""
        a = self.current
        if a is None:
            return "ok"  # the world's own set-up and checks, outside every actor
        if getcurrent() is not a.glet:
            raise RuntimeError(f"store request from outside the running actor (another thread?) ({where})")
        if a.dead or self.failure is not None:
            raise Crash()
        self.steps += 1
        if self.steps > self.max_steps:
            raise self.fail(Violation("livelock", f"more than {self.max_steps} store requests"))
        self.clock.advance(self.tape.pick(TICKS))
        t, r = self.tape, self.rates
        if a.crashable and t.chance(r.crash):
            a.dead = True
            self.trace.append(f"{self.steps} {a.name} CRASH before {method} {where}")
            raise Crash()
        if t.chance(r.switch):
            others = self._ready(but=a)
            if others:
                self._resume(others[t.draw(len(others))])
                if a.dead or self.failure is not None:
                    raise Crash()
        out = self._outcome(method)
        self.trace.append(f"{self.steps} {a.name} {method} {where} {out}")
        return out

    def _outcome(self, method: str) -> Outcome:
        t, r = self.tape, self.rates
        if self.storm:
            self.storm -= 1
            return "lost"
        if t.chance(r.storm):
            self.storm = STORM - 1
            return "lost"
        if not (r.failed or r.lost or r.performed) or method == "clock":
            return "ok"
        v = t.draw(1000)
        if v >= 1000 - r.failed:
            return "failed"
        if v >= 1000 - r.failed - r.lost:
            return "lost"
        if method in WRITES and v >= 1000 - r.failed - r.lost - r.performed:
            return "performed"
        return "ok"
