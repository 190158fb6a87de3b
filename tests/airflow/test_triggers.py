"""airflow/triggers.py: the deferred wait of a mint hands the task back exactly when the gate's rule
says waiting ends: the shard covers the run's interval start, or it made no progress for
``catch_up_after`` seconds; never earlier. The trigger's ``run()`` runs for real in asyncio
against a real shard (a local folder; S3 on a moto server for the main case), on a simulated
clock: its pauses advance it, commits are stamped by it, and another writer's commits land at
chosen simulated times, between pokes (a hook, not a thread that sleeps).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SCHEMA, rows_for, table_of

from shardsink import Shard, hooks
from shardsink.airflow.triggers import EarlierIntervalsTrigger
from shardsink.core.clock import WALL
from shardsink.errors import InvalidUsageError


class SimClock:
    """Simulated time for a trigger's poke loop (injected as its ``clock`` and ``pause``): a pause
    advances it at once, commits are stamped by it, and each step runs at the first poke at or
    after its time (the ``trigger.poked`` hook, in the trigger's thread): no sleeps, no wall clock."""

    def __init__(self) -> None:
        self.start = self.now = time.time()  # epoch: run_started and commit times are epoch seconds
        self.steps: list[tuple[float, Callable[[], Any]]] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        # At least a microsecond: an epoch float cannot advance by less, and a wait of
        # ``patience - idle`` may round to a hair above zero.
        self.now += max(seconds, 1e-6)

    def at(self, offset: float, step: Callable[[], Any]) -> None:
        self.steps.append((self.start + offset, step))

    def poked(self, **_: Any) -> None:
        while self.steps and self.steps[0][0] <= self.now:
            self.steps.pop(0)[1]()

    def elapsed(self) -> float:
        return self.now - self.start


def _run(trigger: EarlierIntervalsTrigger, sim: SimClock) -> tuple[list[dict[str, Any]], float]:
    """All events the trigger yields (it must end by itself), and how long it ran in simulated time."""
    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    trigger.clock, trigger.pause = sim.time, sim.sleep  # type: ignore[method-assign]
    remove = hooks.register("trigger.poked", sim.poked)
    try:
        events = asyncio.run(asyncio.wait_for(collect(), 30))
    finally:
        remove()
    return events, sim.elapsed()


@pytest.fixture
def sim() -> Iterator[SimClock]:
    clock = SimClock()
    with WALL.using(clock.time):  # commits are stamped by the simulated clock (core's public hook)
        yield clock


def _append(shard: Shard, lower: int, upper: int) -> Callable[[], Any]:
    return lambda: shard.append(table_of(rows_for(f"d{lower}", lower, upper)), lower=lower, upper=upper,
                                desc_id=f"d{lower}")


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    return Shard.create((tmp_path / "shard").as_uri(), SCHEMA, upper=0)


def _trigger(shard: Shard, sim: SimClock, **kw: Any) -> EarlierIntervalsTrigger:
    args: dict[str, Any] = {"shard_url": shard.url, "interval_start": 20, "catch_up_after": 60.0,
                            "poke_interval": 0.05, "run_started": sim.start}
    return EarlierIntervalsTrigger(**{**args, **kw})


def test_hands_back_once_the_upper_covers_the_interval_start_and_not_before(shard_url: str, sim: SimClock) -> None:
    """On both stores (a local folder; S3 over HTTP, moto), the reads in the triggerer's threads."""
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    seen: list[int | None] = []
    sim.at(0.3, _append(shard, 0, 10))
    sim.at(0.3, lambda: seen.append(shard.info().upper))
    sim.at(0.9, _append(shard, 10, 20))
    events, took = _run(_trigger(shard, sim), sim)
    assert seen == [10]  # the upper passed 10 < 20 on the way: the trigger kept waiting
    assert events == [{"status": "covered", "upper": 20, "interval_start": 20}]
    assert took >= 0.9


def test_catches_up_after_the_patience_without_progress(shard: Shard, sim: SimClock) -> None:
    events, took = _run(_trigger(shard, sim, catch_up_after=0.6), sim)
    assert [e["status"] for e in events] == ["catch_up"]
    assert events[0]["upper"] == 0 and events[0]["idle_s"] >= 0.6
    assert 0.6 <= took < 0.6 + 0.05 + 1e-6  # handed back at the first poke past the patience


def test_progress_below_the_interval_start_postpones_catching_up(shard: Shard, sim: SimClock) -> None:
    sim.at(0.5, _append(shard, 0, 10))
    events, took = _run(_trigger(shard, sim, catch_up_after=0.8), sim)
    assert [(e["status"], e["upper"]) for e in events] == [("catch_up", 10)]
    assert took >= 0.5 + 0.8 - 0.001  # idle counts from the commit (ms-precision timestamp), not the start


def test_a_covered_or_closed_shard_hands_back_at_once(shard: Shard, sim: SimClock) -> None:
    events, took = _run(_trigger(shard, sim, interval_start=0), sim)
    assert events == [{"status": "covered", "upper": 0, "interval_start": 0}] and took == 0
    shard.close(expected_upper=0)
    events, _ = _run(_trigger(shard, sim), sim)
    assert [e["status"] for e in events] == ["ready"]


def test_an_unreadable_shard_hands_the_task_back_to_decide(tmp_path: Path, sim: SimClock) -> None:
    missing = EarlierIntervalsTrigger(shard_url=(tmp_path / "none").as_uri(), interval_start=5, catch_up_after=60,
                                      poke_interval=0.05)
    events, _ = _run(missing, sim)
    assert [e["status"] for e in events] == ["unreadable"]
    assert "ShardNotFoundError" in events[0]["error"]


def test_serializes_plain_values_that_rebuild_the_same_trigger(shard: Shard, sim: SimClock) -> None:
    from airflow.sdk._shared.module_loading import import_string

    t = _trigger(shard, sim, aws_conn_id="my_s3")
    path, kwargs = t.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON: stored in Airflow's trigger table
    assert set(kwargs) == {"shard_url", "interval_start", "catch_up_after", "poke_interval", "run_started",
                           "aws_conn_id"}
    again = import_string(path)(**kwargs)
    assert again.serialize() == (path, kwargs)


@pytest.mark.parametrize("bad", [
    {"interval_start": -1}, {"interval_start": True}, {"interval_start": "5"}, {"poke_interval": 0},
    {"poke_interval": math.nan}, {"catch_up_after": -1.0}, {"catch_up_after": math.inf}, {"shard_url": ""},
    {"run_started": -5.0}, {"run_started": math.nan}, {"run_started": True}, {"aws_conn_id": ""},
])
def test_a_bad_argument_is_refused_naming_it(shard: Shard, sim: SimClock, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsageError) as e:
        _trigger(shard, sim, **bad)
    assert next(iter(bad)) in str(e.value)
