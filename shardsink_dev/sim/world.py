"""One schedule, from its seed: draw the plan, build the world, run the actors, check the end.

:func:`run_schedule` is the whole of one schedule: the plan drawn from the tape
(:func:`draw_plan`), the shard created (its first version, outside every actor), the DAG runs
(:mod:`shardsink_dev.sim.runs`), maintenance and readers (:mod:`shardsink_dev.sim.maint`) and, in
the landing world, the producer (:mod:`shardsink_dev.sim.landing`) spawned as actors, run to the
end under the baton scheduler with the invariant checker watching every write
(:mod:`shardsink_dev.sim.check`), then the end-of-schedule checks (:mod:`shardsink_dev.sim.final`).

Contract: :class:`Result` says whether an invariant broke (its kind and message), at which step,
the steps taken, and the tape's choices: replaying those choices with the same seed
(``replay=``) makes the same schedule, request for request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shardsink.core.shard import Shard
from shardsink_dev.sim import final, maint
from shardsink_dev.sim.check import Checker
from shardsink_dev.sim.ctx import EPOCH, LANDING_BUCKET, SHARD_BUCKET, SHARD_URL, Plan, Sim
from shardsink_dev.sim.harness import injected
from shardsink_dev.sim.runs import Run
from shardsink_dev.sim.sched import Rates, Scheduler, Violation
from shardsink_dev.sim.sources import SCHEMA, TickSource, TickWriter
from shardsink_dev.sim.store import SimClock, World
from shardsink_dev.sim.tape import Tape


@dataclass(frozen=True)
class Result:
    """One schedule's end: ``kind``/``message`` of the violation (None: every invariant held)."""

    seed: int
    kind: str | None
    message: str | None
    steps: int
    choices: list[int]
    trace: list[str]

    @property
    def failed(self) -> bool:
        return self.kind is not None

    def digest(self) -> str:
        """A fingerprint of the schedule's requests (equal digests: the same schedule)."""
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]


def draw_plan(tape: Tape) -> Plan:
    """The schedule's plan. Every draw's 0 is the plainest choice (one run, no fault, ...)."""
    rates = Rates(switch=int(tape.pick((300, 100, 600, 900))), crash=int(tape.pick((0, 5, 20, 60))),
                  failed=int(tape.pick((0, 10, 40))), lost=int(tape.pick((0, 10, 40))),
                  performed=int(tape.pick((0, 10, 40))))
    landing = tape.chance(0)  # the landing world joins in its own step
    return Plan(
        landing=landing, runs=1 + tape.draw(3), interval=100, max_span=int(tape.pick((100, 50, 40))) or None,
        max_chain=1 + tape.draw(2), slots=1 + tape.draw(2), ahead=tape.chance(600), twins=int(tape.pick((0, 150))),
        retries=1 + tape.draw(2), attempts=1 + tape.draw(3), rates=rates,
        compact=tape.draw(3), since=tape.draw(3), gc=tape.draw(3), reader=tape.draw(2), evolve=tape.chance(250),
        grace_s=float(tape.pick((600.0, 120.0, 1800.0))), max_wait=float(tape.pick((3600.0, 300.0))),
        catch_up_after=float(tape.pick((600.0, 60.0))), producer=0,
    )


def _spawn_world(sim: Sim) -> TickSource:
    """The shard, and every actor of the plan."""
    p = sim.plan
    source = TickSource(sim, step=int(sim.tape.pick((25, 10, 33))), period=float(sim.tape.pick((60.0, 5.0, 300.0))),
                        end=p.runs * p.interval)
    Shard.create(SHARD_URL, SCHEMA, upper=0, writer="setup")
    writer = TickWriter(source)
    backfill = sim.tape.chance(500)
    for i in range(p.runs):
        Run(sim, i, writer).start(0.0 if backfill else i * source.period + sim.tape.pick((0.0, 30.0)))
    maint.passes(sim, "compact", p.compact, lambda i: maint.compaction(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "since", p.since, lambda i: maint.since(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "gc", p.gc, lambda i: maint.gc(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "reader", p.reader, maint.reader(sim, source.rows_as_of), first=sim.tape.pick(maint.GAPS))
    if p.evolve:
        maint.passes(sim, "evolve", 1, lambda i: maint.evolve(sim, i), first=sim.tape.pick(maint.GAPS))
    return source


def run_schedule(seed: int, replay: list[int] | None = None) -> Result:
    """Run one schedule (module docstring)."""
    tape = Tape(seed, replay)
    plan = draw_plan(tape)
    world = World(SimClock(EPOCH))
    sched = Scheduler(tape, world.clock, plan.rates)
    checker = Checker(world, sched, SHARD_BUCKET, SHARD_URL.split("/", 3)[3])
    sim = Sim(seed, tape, plan, world, sched, checker)
    with injected(world, seed, [SHARD_BUCKET, LANDING_BUCKET]):
        world.gate = sched
        try:
            source = _spawn_world(sim)
            sched.run()
            if sched.failure is None:
                sched.current = None
                final.exactly_once(sim)
                final.contents(sim, source.rows_as_of)
                final.gc_and_verify(sim)
        except Violation:
            pass  # recorded by the scheduler
        except Exception as e:  # the end-of-schedule checks themselves failed: a bug found there
            sched.fail(Violation("final-check-error", f"{type(e).__name__}: {e}"))
    v = sched.failure
    return Result(seed, v.kind if v else None, str(v) if v else None, sched.steps, tape.choices, sched.trace)
