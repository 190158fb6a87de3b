"""One schedule's context: its plan, the world, the scheduler, the checker and the writers' ledger.

:class:`Plan` is what the tape drew for the schedule (how many runs, which maintenance, the
fault rates, ...); :class:`Ledger` is what the actors were told (the reference model's inputs:
descriptions minted, acknowledged, ambiguous; files refused); :class:`Sim` ties them together and
hands out shard handles as a fresh process would open them (over the served store, retries
sleeping in simulated time, the known-head clock simulated too).

:func:`judge` classifies what an Airflow task's body raised, as Airflow and the task code treat
it: retried (a crash, an unknown outcome, a storage failure, a lost race), failed for good (bad
input: late or malformed files, a missing plan; an unknown fate), or a violation (anything else:
the simulator injects no corruption, so a CorruptionError, like an AssertionError or a TypeError,
is a bug found).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, FateUnknownError, InvalidUsageError, ShardsinkError
from shardsink.sinks.description import Description
from shardsink_dev.sim.check import Checker
from shardsink_dev.sim.sched import Crash, Rates, Scheduler, Violation
from shardsink_dev.sim.store import World
from shardsink_dev.sim.tape import Tape

SHARD_BUCKET = "sim-shards"
LANDING_BUCKET = "sim-landing"
SHARD_URL = f"s3://{SHARD_BUCKET}/data/shard"
LANDING_URL = f"s3://{LANDING_BUCKET}/zone"
DAG = "sim"
#: The start of simulated time (epoch s) and of shard times (ms).
EPOCH = 1_800_000_000.0


@dataclass(frozen=True)
class Plan:
    """What the tape drew for one schedule (see :func:`shardsink_dev.sim.world.draw_plan`)."""

    landing: bool
    runs: int
    interval: int
    max_span: int | None
    max_chain: int
    slots: int
    ahead: bool
    twins: int  # per mille, per task try
    retries: int
    attempts: int
    rates: Rates
    compact: int  # passes of each maintenance actor (0: none)
    since: int
    gc: int
    reader: int
    evolve: bool
    grace_s: float
    max_wait: float
    catch_up_after: float
    producer: int  # landing: misbehaviours of the producer (late, rewritten, restored files)
    iceberg: bool  # the shard's Iceberg view on (kept by every committing actor)


@dataclass
class Ledger:
    """What the writers were told: the reference model's inputs."""

    minted: dict[str, Description] = field(default_factory=dict)
    run_of: dict[str, str] = field(default_factory=dict)  # description id -> its DAG run's slug
    acked: set[str] = field(default_factory=set)
    attempted: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # landed file key -> the error refusing it
    outcomes: list[str] = field(default_factory=list)


@dataclass
class Sim:
    """The context every actor of one schedule shares."""

    seed: int
    tape: Tape
    plan: Plan
    world: World
    sched: Scheduler
    checker: Checker
    ledger: Ledger = field(default_factory=Ledger)

    def shard(self) -> Shard:
        """A fresh handle on the shard, as a new process opens it (the simulated known-head clock)."""
        return Shard(SHARD_URL, sleep=self.world.clock.advance, clock=self.world.clock.time)

    def now(self) -> float:
        return self.world.clock.now

    def violation(self, kind: str, message: str) -> Violation:
        return self.sched.fail(Violation(kind, message))


Verdict = Literal["ok", "retry", "fail"]


def judge(sim: Sim, who: str, error: BaseException | None) -> Verdict:
    """How Airflow and the task code take what a task's body raised (module docstring);
    a violation is raised for anything no correct run may raise."""
    if error is None:
        return "ok"
    if isinstance(error, Crash | Violation):
        return "retry"
    if isinstance(error, CorruptionError):
        raise sim.violation("corruption-reported", f"{who}: {type(error).__name__}: {error}")
    if isinstance(error, InvalidUsageError | FateUnknownError):
        sim.ledger.outcomes.append(f"{who}: {type(error).__name__}: {str(error)[:200]}")
        return "fail"
    if isinstance(error, ShardsinkError):
        return "retry"
    raise sim.violation("unexpected-error", f"{who}: {type(error).__name__}: {error}")
