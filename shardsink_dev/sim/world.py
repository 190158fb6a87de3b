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
from collections.abc import Callable
from dataclasses import dataclass

from shardsink import iceberg
from shardsink.core.shard import Shard
from shardsink.sources.landing import LandingSource
from shardsink_dev.sim import final, maint
from shardsink_dev.sim.check import Checker
from shardsink_dev.sim.ctx import EPOCH, LANDING_BUCKET, LANDING_URL, SHARD_BUCKET, SHARD_URL, Plan, Sim
from shardsink_dev.sim.harness import injected, per_process
from shardsink_dev.sim.landing import TIME_COLUMN, Producer, ZoneModel
from shardsink_dev.sim.runs import Run
from shardsink_dev.sim.sched import Rates, Scheduler, Violation
from shardsink_dev.sim.sources import SCHEMA, TickSource, TickWriter
from shardsink_dev.sim.store import SimClock, World
from shardsink_dev.sim.tape import Tape
from shardsink_dev.sim.zone_slot import ZoneWriter, check_zone, drain


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


def _passes(tape: Tape) -> int:
    """How many passes a maintenance actor makes: none in most schedules (each costs real work)."""
    return int(tape.chance(350)) + int(tape.chance(150))


def draw_plan(tape: Tape) -> Plan:
    """The schedule's plan. Every draw's 0 is the plainest choice (one run, no fault, ...)."""
    rates = Rates(switch=int(tape.pick((300, 100, 600, 900))), crash=int(tape.pick((0, 5, 20, 60))),
                  failed=int(tape.pick((0, 10, 40))), lost=int(tape.pick((0, 10, 40))),
                  performed=int(tape.pick((0, 10, 40))), storm=int(tape.pick((0, 0, 8))))
    landing = tape.chance(400)
    return Plan(
        landing=landing, runs=int(tape.pick((2, 1, 3))), interval=100,
        max_span=int(tape.pick((100, 100, 50, 40))) or None, max_chain=1 + tape.draw(2),
        slots=1 + int(tape.chance(250)), ahead=tape.chance(600), twins=int(tape.pick((0, 150))),
        retries=1 + tape.draw(2), attempts=1 + tape.draw(3), rates=rates,
        compact=_passes(tape), since=_passes(tape), gc=_passes(tape), reader=_passes(tape),
        evolve=not landing and tape.chance(200),
        grace_s=float(tape.pick((600.0, 120.0, 1800.0))), max_wait=float(tape.pick((3600.0, 300.0))),
        catch_up_after=float(tape.pick((600.0, 60.0))), producer=tape.draw(3) if landing else 0,
        iceberg=tape.chance(200),
    )


def _maintenance(sim: Sim, expected: final.Model | None) -> None:
    p = sim.plan
    maint.passes(sim, "compact", p.compact, lambda i: maint.compaction(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "since", p.since, lambda i: maint.since(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "gc", p.gc, lambda i: maint.gc(sim, i), first=sim.tape.pick(maint.GAPS))
    maint.passes(sim, "reader", p.reader, maint.reader(sim, expected), first=sim.tape.pick(maint.GAPS))
    if p.evolve:
        maint.passes(sim, "evolve", 1, lambda i: maint.evolve(sim, i), first=sim.tape.pick(maint.GAPS))


def _spawn_world(sim: Sim) -> Callable[[], None]:
    """The shard and every actor of the plan; returns the end-of-schedule checks of its world."""
    p, tape = sim.plan, sim.tape
    period = float(tape.pick((60.0, 5.0, 300.0)))
    shard = Shard.create(SHARD_URL, SCHEMA, upper=0, writer="setup")
    if p.iceberg:
        iceberg.enable(shard, writer="setup")
    backfill = tape.chance(500)
    starts = [0.0 if backfill else i * period + tape.pick((1.0, 30.0)) for i in range(p.runs)]
    if p.landing:
        model = ZoneModel()
        producer = Producer(sim, model, period=period, intervals=p.runs)
        zone = ZoneWriter(LandingSource(LANDING_URL, time_column=TIME_COLUMN, schema=SCHEMA))
        producer.start()
        for i in range(p.runs):
            Run(sim, i, zone).start(starts[i] + (p.runs * period if backfill else 0.0))
        _maintenance(sim, None)

        def end_landing() -> None:
            drain(sim, producer, zone, (p.runs + 1) * p.interval)
            final.exactly_once(sim)
            check_zone(sim, model)
            final.gc_and_verify(sim)
        return end_landing
    source = TickSource(sim, step=int(tape.pick((25, 10, 33))), period=period, end=p.runs * p.interval)
    for i in range(p.runs):
        Run(sim, i, TickWriter(source)).start(starts[i])
    _maintenance(sim, source.rows_as_of)

    def end_direct() -> None:
        final.exactly_once(sim)
        snapshot = final.contents(sim, source.rows_as_of)
        final.gc_and_verify(sim, snapshot)
    return end_direct


def run_schedule(seed: int, replay: list[int] | None = None) -> Result:
    """Run one schedule (module docstring)."""
    tape = Tape(seed, replay)
    plan = draw_plan(tape)
    world = World(SimClock(EPOCH))
    sched = Scheduler(tape, world.clock, plan.rates)
    sched.on_resume = per_process
    checker = Checker(world, sched, SHARD_BUCKET, SHARD_URL.split("/", 3)[3])
    sim = Sim(seed, tape, plan, world, sched, checker)
    with injected(world, seed, [SHARD_BUCKET, LANDING_BUCKET]):
        world.gate = sched
        try:
            finish = _spawn_world(sim)
            sched.run()
            if sched.failure is None:
                sched.current = None
                per_process(None)
                finish()
        except Violation:
            pass  # recorded by the scheduler
        except Exception as e:  # the end-of-schedule checks themselves failed: a bug found there
            sched.fail(Violation("final-check-error", f"{type(e).__name__}: {e}"))
    v = sched.failure
    return Result(seed, v.kind if v else None, str(v) if v else None, sched.steps, tape.choices, sched.trace)
