"""A backfill's descriptions minted ahead of the shard's upper, staged at once, appended in order.

Each later day's description ``[k*DAY, (k+1)*DAY)`` is staged while the shard's upper is still
below its lower; its append may commit only in its turn. Every append here runs in its own OS
process (as an Airflow task does), some killed at a hook, and the shard is checked against the
independent model (tests/support ``audit``) at the end:

* a description ahead of the upper is StillPossible, however old: the fate primitive refuses to
  delete it, GC (grace 0, and a clock ten days on) and the compaction sweep keep every object it
  staged, and ``verify`` lists them in flight, never as leaks;
* its append out of turn refuses without deleting anything (UpperMismatchError, not a loss);
* the append of day k killed (before its commit, or after it: a lost ack) while days k+1..
  are staged: the retry lands day k once, then the rest commit in order;
* day k failing for good, then cleared (a fresh description for day k): the rest commit in
  order and the failed description's objects go with GC once the upper passes it;
* twins of an ahead-minted append: out of turn both refuse; in turn exactly one commits,
  also when one twin is the append's turn trigger committing on the triggerer.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid
from typing import Any

import pytest
from support import SCHEMA, Row, audit, rows_for, table_of

from shardsink import Shard
from shardsink.core.fate import CannotCommit, DeleteRefusedError, StillPossible
from shardsink.maintenance import compact, sweep
from shardsink.maintenance.compact import CompactOptions
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.schedule import ScheduleOptions
from shardsink.maintenance.verify import verify
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description, to_builtins
from shardsink.sinks.staging import write_manifest
from shardsink.sinks.waiting import ahead_of, at_upper, staged_descriptions

SLOTS = 2
DAY = 10
TEN_DAYS_S = 10 * 86_400

@pytest.fixture
def backend() -> str:
    """Local only: the appends race on the store's objects, not its protocol; an S3 round
    costs the suite CPU and covers nothing more."""
    return "local"



def _day(k: int, tag: str = "") -> Description:
    return Description(f"day{k}{tag}-{uuid.uuid4().hex[:8]}", k * DAY, (k + 1) * DAY, 1)


def _stage(shard: Shard, d: Description, *, slots: range = range(SLOTS)) -> list[Row]:
    """Stage ``d``'s writer slots with manifests (what its write tasks do); its rows."""
    out: list[Row] = []
    for slot in slots:
        rows = rows_for(f"{d.desc_id}-s{slot}", d.lower, d.upper, count=2)
        staged = shard.stage(table_of(rows), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
        write_manifest(shard, d, slot=slot, slots=SLOTS, parts=staged.parts)
        out += rows
    return out


def _append_worker(url: str, env: dict[str, str], job: dict[str, Any], kill_at: str | None, results: Any,
                   barrier: Any) -> None:
    """One append, as an append task runs it; killed (exit 9) at hook ``kill_at`` if given."""
    os.environ.update(env)
    from shardsink import hooks
    from shardsink.errors import UpperMismatchError
    from shardsink.sinks.append import LostRaceError

    if kill_at is not None:
        hooks.register(kill_at, lambda **_: os._exit(9))  # type: ignore[arg-type]
    d = Description.decode(job)
    if barrier is not None:
        barrier.wait()
    try:
        results.put((d.desc_id, append_from_manifests(Shard(url), d, SLOTS).status))
    except LostRaceError:
        results.put((d.desc_id, "lost"))
    except UpperMismatchError:
        results.put((d.desc_id, "not_its_turn"))
    except Exception as e:  # reported, so the parent fails with the cause
        results.put((d.desc_id, f"error {type(e).__name__}: {e}"))


def _appends(url: str, descs: list[Description], *, kill_at: str | None = None) -> dict[str, str]:
    """Run one process per append, all at once; each description's outcome ("killed" if its
    process died)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    barrier = None
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    procs = [ctx.Process(target=_append_worker, args=(url, env, to_builtins(d), kill_at, results, barrier))
             for d in descs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    out = {d.desc_id: "killed" for d, p in zip(descs, procs, strict=True) if p.exitcode == 9}
    while len(out) < len(descs):
        desc_id, status = results.get(timeout=30)
        out[desc_id] = status
    return out


def _assert_waiting(shard: Shard, waiting: list[Description]) -> None:
    """Every object ``waiting`` staged is there, StillPossible, undeletable, kept by GC and the
    compaction sweep however old, and in flight for ``verify`` (no leak)."""
    admin = shard.admin()
    before = {d.desc_id: sorted(o.key for o in admin.list_staged(d.desc_id)) for d in waiting}
    for d in waiting:
        assert isinstance(shard.fate(d.desc_id, d.lower), StillPossible)
        with pytest.raises(DeleteRefusedError):
            shard.writer().delete_staged(d.desc_id, d.lower)
    compact(shard, options=CompactOptions(schedule=ScheduleOptions(min_rows=1)))
    sweep(shard, grace_s=0)
    for offset in (0, TEN_DAYS_S):  # now, and ten days on: age never makes them leaks
        def later(offset: float = offset) -> float:
            return time.time() + offset

        collect(shard, GcOptions(grace_s=0, clock=later))
        report = verify(shard, now=later(), grace_s=0)
        assert report.ok, report.problems
        flying = {x.object for x in report.in_flight}
        for d in waiting:
            assert set(before[d.desc_id]) <= flying, (d.desc_id, report.leaks)
        assert not {x.object for x in report.leaks} & {k for ks in before.values() for k in ks}
    assert {d.desc_id: sorted(o.key for o in admin.list_staged(d.desc_id)) for d in waiting} == before


def _assert_settled(shard: Shard, blob: Any, model: dict[str, list[Row]], *, upper: int) -> None:
    """The shard equals the model (committed once each, in order, every referenced part there) and,
    after GC, ``verify`` finds no problem, no leak and nothing in flight."""
    a = audit(blob, model, url=shard.url)
    assert a.uppers[-1] == upper
    collect(shard, GcOptions(grace_s=0))
    report = verify(shard, grace_s=0)
    assert report.ok and not report.leaks and not report.in_flight, (report.problems, report.leaks, report.in_flight)


@pytest.mark.parametrize("kill_at", ["append.before_commit", "append.committed"])
def test_the_append_of_day_k_killed_while_later_days_are_staged(shard_url: str, blob: Any, kill_at: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    days = [_day(k) for k in range(5)]
    model = {d.desc_id: _stage(shard, d) for d in days}  # every day minted and staged at once
    for d in days[:2]:
        assert append_from_manifests(shard, d, SLOTS).status == "committed"
    staged = staged_descriptions(shard)
    assert [s.desc_id for s in at_upper(staged, 2 * DAY)] == [days[2].desc_id]
    assert [s.desc_id for s in ahead_of(staged, 2 * DAY)] == [days[3].desc_id, days[4].desc_id]
    assert _appends(shard_url, [days[2]], kill_at=kill_at) == {days[2].desc_id: "killed"}
    out = _appends(shard_url, days[3:])  # out of turn (or, after a lost ack, day 3's turn)
    if kill_at == "append.before_commit":
        assert set(out.values()) == {"not_its_turn"}, out
        _assert_waiting(shard, days[3:])
        assert _appends(shard_url, [days[2]]) == {days[2].desc_id: "committed"}  # the task's retry
        out = _appends(shard_url, [days[3]])
    else:  # day 2 landed, its ack was lost: day 3's turn came; day 4's came too if day 3 was first
        assert out[days[4].desc_id] in ("not_its_turn", "committed"), out
        if out[days[4].desc_id] == "not_its_turn":
            _assert_waiting(shard, [days[4]])
        assert _appends(shard_url, [days[2]]) == {days[2].desc_id: "already_committed"}
    assert out[days[3].desc_id] == "committed", out
    if out.get(days[4].desc_id) != "committed":
        assert _appends(shard_url, [days[4]]) == {days[4].desc_id: "committed"}
    _assert_settled(shard, blob, model, upper=5 * DAY)


def test_day_k_failing_for_good_then_cleared_commits_the_rest_in_order(shard_url: str, blob: Any) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    days = [_day(k) for k in range(4)]
    model = {days[0].desc_id: _stage(shard, days[0])}
    _stage(shard, days[1], slots=range(1))  # day 1's run failed for good: one slot staged, never appended
    later = {d.desc_id: _stage(shard, d) for d in days[2:]}
    assert append_from_manifests(shard, days[0], SLOTS).status == "committed"
    assert set(_appends(shard_url, days[2:]).values()) == {"not_its_turn"}
    _assert_waiting(shard, days[1:])  # the failed one may still commit too: nothing of it goes
    cleared = _day(1, "-cleared")  # clearing the run mints afresh for day 1
    model[cleared.desc_id] = _stage(shard, cleared)
    assert _appends(shard_url, [cleared]) == {cleared.desc_id: "committed"}
    assert isinstance(shard.fate(days[1].desc_id, days[1].lower), CannotCommit)
    for d in days[2:]:
        assert _appends(shard_url, [d]) == {d.desc_id: "committed"}
    model.update(later)
    _assert_settled(shard, blob, model, upper=4 * DAY)
    assert not shard.admin().list_staged(days[1].desc_id)  # the failed description's objects went with GC


def test_twins_of_an_ahead_minted_append(shard_url: str, blob: Any) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    day0, day1 = _day(0), _day(1)
    model = {day0.desc_id: _stage(shard, day0), day1.desc_id: _stage(shard, day1)}
    twins = [day1, day1]
    assert _twin_round(shard_url, twins) == ["not_its_turn", "not_its_turn"]
    _assert_waiting(shard, [day1])
    assert append_from_manifests(shard, day0, SLOTS).status == "committed"
    assert sorted(_twin_round(shard_url, twins)) == ["already_committed", "committed"]
    # The append's turn trigger (issue 34: it commits on the triggerer) against a twin task.
    day2 = _day(2)
    model[day2.desc_id] = _stage(shard, day2)
    assert sorted(_twin_round(shard_url, [day2, day2], turn_trigger=True)) == ["already_committed", "committed"]
    _assert_settled(shard, blob, model, upper=3 * DAY)  # committed once, every part it references kept


def _turn_worker(url: str, env: dict[str, str], job: dict[str, Any], kill_at: str | None, results: Any,
                 barrier: Any) -> None:
    """The append's turn trigger, as the triggerer runs it: commits ``job`` when the upper is its lower."""
    import asyncio

    os.environ.update(env)
    from shardsink.airflow.results import TurnCommit
    from shardsink.airflow.triggers import TurnTrigger

    d = Description.decode(job)
    now = time.time()
    trigger = TurnTrigger(shard_url=url, lower=d.lower, poke_interval=0.05, waiting_since=now, deadline=now + 60,
                          commit=to_builtins(TurnCommit(chain=(d,), slots=SLOTS, writer="twin")))

    async def first() -> dict[str, Any]:
        async for e in trigger.run():
            return dict(e.payload)
        raise AssertionError("the trigger ended without an event")

    barrier.wait()
    asyncio.run(first())
    # Who committed it is the shard log's to say: the trigger's writer, or the twin's.
    fate = Shard(url).fate(d.desc_id, d.lower)
    results.put((d.desc_id, "committed" if getattr(fate, "writer", None) == "twin" else "already_committed"))


def _twin_round(url: str, twins: list[Description], *, turn_trigger: bool = False) -> list[str]:
    """Two processes append the same description at once (released by a barrier); with
    ``turn_trigger`` the first is the append's turn trigger committing it."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(len(twins))
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    procs = [ctx.Process(target=_turn_worker if turn_trigger and i == 0 else _append_worker,
                         args=(url, env, to_builtins(d), None, results, barrier)) for i, d in enumerate(twins)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    return [results.get(timeout=30)[1] for _ in twins]
