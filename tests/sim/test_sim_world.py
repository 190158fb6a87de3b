"""The simulator's parts on their own: the in-memory store keeps S3's semantics, the gate's four
outcomes raise what the S3 backend raises, and the checker stops a schedule at the step that
breaks an invariant."""

from __future__ import annotations

import json

import pytest

from shardsink.errors import ConditionFailedError, StorageError, UnknownOutcomeError
from shardsink.storage.base import SourceVersion
from shardsink_dev.sim.check import Checker
from shardsink_dev.sim.sched import Rates, Scheduler, Violation
from shardsink_dev.sim.store import MemBlob, Outcome, SimClock, World, etag_of
from shardsink_dev.sim.tape import Tape


class Fixed:
    """A gate answering every request with one outcome."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def request(self, method: str, where: str) -> Outcome:
        return self.outcome


def blob(world: World | None = None) -> MemBlob:
    return MemBlob(world or World(SimClock(1000.5)), "b", "root/shard")


def test_conditional_writes_and_etags_are_s3s() -> None:
    b = blob()
    tag = b.create("state/v/1.json", b"one")
    assert tag == etag_of(b"one") and b.get("state/v/1.json").etag == tag  # type: ignore[union-attr]
    with pytest.raises(ConditionFailedError):
        b.create("state/v/1.json", b"two")
    with pytest.raises(ConditionFailedError):
        b.replace("state/v/1.json", b"two", etag=etag_of(b"other"))
    with pytest.raises(ConditionFailedError):
        b.replace("state/LATEST.json", b"x", etag=tag)  # If-Match on a missing object
    assert b.replace("state/v/1.json", b"two", etag=tag) == etag_of(b"two")
    assert b.put("parts/d/x.parquet", b"one") == tag  # equal bytes, equal ETag


def test_listing_carries_whole_second_times_and_the_store_clock_trails_them() -> None:
    w = World(SimClock(1000.7))
    b = blob(w)
    at = b.clock()
    b.put("parts/d/a.parquet", b"a")
    w.clock.advance(0.5)
    b.put("parts/d/b.parquet", b"b")
    got = list(b.list("parts/"))
    assert [(o.key, o.modified, o.identity) for o in got] == [
        ("parts/d/a.parquet", 1000.0, etag_of(b"a")), ("parts/d/b.parquet", 1001.0, etag_of(b"b"))]
    assert at == 999.0 and all(o.modified >= at for o in got)


def test_a_ranged_read_refuses_another_version_of_the_object() -> None:
    b = blob()
    b.put("f.parquet", b"0123456789")
    listed = SourceVersion(10, 0.0, etag_of(b"0123456789"))
    assert b.get_source_range("f.parquet", 2, 5, expect=listed) == b"234"
    b.put("f.parquet", b"9876543210")
    with pytest.raises(ConditionFailedError):
        b.get_source_range("f.parquet", 2, 5, expect=listed)


@pytest.mark.parametrize(("outcome", "error", "applied"), [
    ("failed", StorageError, False), ("lost", UnknownOutcomeError, False), ("performed", UnknownOutcomeError, True)])
def test_the_four_outcomes_of_a_write(outcome: Outcome, error: type[Exception], applied: bool) -> None:
    w = World(SimClock(0.0), gate=Fixed(outcome))
    b = blob(w)
    with pytest.raises(error):
        b.create("state/v/1.json", b"x")
    w.gate = Fixed("ok")
    assert (b.get("state/v/1.json") is not None) == applied


def test_a_read_that_times_out_is_a_retryable_storage_error() -> None:
    b = blob(World(SimClock(0.0), gate=Fixed("lost")))
    with pytest.raises(StorageError) as e:
        b.get("state/LATEST.json")
    assert e.value.retryable


def _version(seqno: int, upper: int, since: int = 0, kind: str = "append", desc: str = "d") -> bytes:
    commit = {"kind": kind, "desc_id": f"{desc}{seqno}", "lower": upper - 10, "upper": upper}
    return json.dumps({"seqno": seqno, "header": {"upper": upper, "since": since}, "commit": commit,
                       "added": [], "removed": []}).encode()


@pytest.mark.parametrize(("versions", "kind"), [
    ([(0, 10), (2, 20)], "seqno-gap"),
    ([(0, 10), (1, 5)], "upper-moved-back"),
])
def test_the_checker_stops_the_schedule_at_the_step_that_breaks_an_invariant(
        versions: list[tuple[int, int]], kind: str) -> None:
    w = World(SimClock(0.0))
    sched = Scheduler(Tape(0), w.clock, Rates())
    Checker(w, sched, "b", "root/shard")
    b = blob(w)
    with pytest.raises(Violation) as v:
        for seqno, upper in versions:
            b.create(f"state/v/{seqno:020d}.json", _version(seqno, upper))
    assert v.value.kind == kind and sched.failure is v.value


def test_an_error_escaping_the_run_unwinds_the_suspended_actors_at_once() -> None:
    """A harness bug (an ``on_end`` raising) stops the run; the actor it left mid-request is killed
    there and then (its ``finally`` reaches no store), not later by the garbage collector."""
    w = World(SimClock(0.0))
    sched = Scheduler(Tape(0, replay=[]), w.clock, Rates(switch=1000))  # plain choices: the holder first
    w.gate = sched
    b = blob(w)
    unwound: list[str] = []

    def holder() -> None:
        try:
            b.get("state/LATEST.json")  # hands the baton to the other actor, which ends the run
            b.get("state/LATEST.json")
        finally:
            unwound.append("finally")
            b.put("parts/d/x.parquet", b"x")  # raises Crash: never performed

    def broken(_: object) -> None:
        raise RuntimeError("a bug in the world's on_end")

    sched.spawn("holder", holder)
    sched.spawn("other", lambda: None, on_end=broken)
    with pytest.raises(RuntimeError, match="on_end"):
        sched.run()
    assert unwound == ["finally"] and w.objects("b") == {}
    assert all(a.glet is None or a.glet.dead for a in sched.actors)
