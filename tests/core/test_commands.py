"""The commit as data (shardsink.core.commands, transitions.apply) and the one commit loop
(Machine.commit): every command kind through one pure function and one conditional put.

Faults are injected the way tests/maintenance/test_gc_crash.py does it, by a small store
wrapper around a local folder (test_faults.py covers the same outcomes over HTTP against
moto); backoff sleeps are injected (recorded, not slept) through the policy's ``with_sleep``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard, ShardExistsError, UnknownOutcomeError
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.commands import (
    AppendCommand,
    Command,
    CompactCommand,
    CreateCommand,
    EvolveToCommand,
    RetentionCommand,
    SinceCommand,
    Stamp,
)
from shardsink.core.machine import Machine
from shardsink.errors import InvalidUsageError
from shardsink.storage.base import Blob
from shardsink.storage.local import LocalBlob
from shardsink.storage.retry import COMMIT, STORAGE, RetryPolicy

SCHEMA = pa.schema([("k", pa.string())])
WIDER = pa.schema([("k", pa.large_string()), ("n", pa.int64())])  # a widening and an add: one schema id
AT = "2026-01-01T00:00:00.000+00:00"


def part(key: str, rows: int = 2) -> st.PartMeta:
    return st.PartMeta(key, rows, 100, 0, 9)


def stamp(nonce: str = "n", writer: str = "w") -> Stamp:
    return Stamp(writer, AT, nonce)


def create(upper: int = 0) -> CreateCommand:
    return CreateCommand(SCHEMA, upper)


def append(desc_id: str, lower: int, upper: int | None, *parts: st.PartMeta) -> AppendCommand:
    return AppendCommand(desc_id, lower, upper, tuple(parts))


def step(v: st.Version, batches: tuple[st.BatchMeta, ...], cmd: Command) -> st.Version:
    out = tr.apply(v.header, batches, cmd, stamp())
    assert isinstance(out, st.Version), out
    return out


def history() -> tuple[st.Version, tuple[st.BatchMeta, ...]]:
    """Version 2 of a shard with two appended batches d1 [0, 10) and d2 [10, 20), and its live batches."""
    v0 = tr.apply(None, (), create(), stamp("c0", "creator"))
    assert isinstance(v0, st.Version)
    v1 = step(v0, (), append("d1", 0, 10, part("p1")))
    v2 = step(v1, (), append("d2", 10, 20, part("p2")))
    return v2, tr.apply_diffs((), [v1, v2])


def compaction(cid: str = "cmp", inputs: tuple[str, ...] = ("d1", "d2")) -> CompactCommand:
    return CompactCommand(cid, inputs, 0, 20, 0, (part("c", 4),))


# --- (a) apply is pure -------------------------------------------------------------------------

def test_apply_is_pure_for_every_command_kind() -> None:
    head, live = history()
    commands: list[tuple[st.Header | None, Command]] = [
        (None, create()),
        (head.header, append("d3", 20, 30, part("p3"))),
        (head.header, append("close", 20, None)),
        (head.header, compaction()),
        (head.header, SinceCommand(None, 15)),
        (head.header, RetentionCommand(5)),
        (head.header, EvolveToCommand(target=WIDER)),
    ]
    for header, cmd in commands:
        first, second = tr.apply(header, live, cmd, stamp("x1")), tr.apply(header, live, cmd, stamp("x1"))
        assert isinstance(first, st.Version), (cmd, first)
        assert first == second, cmd
        assert (first.commit.nonce, first.commit.writer, first.commit.at) == ("x1", "w", AT)
    assert head == history()[0], "applying changed nothing it was given"


def test_apply_dispatches_to_the_rule_of_each_kind() -> None:
    head, live = history()
    assert tr.apply(None, (), create(upper=7), stamp()) == tr.initial_version(schema=SCHEMA, upper=7, stamp=stamp())
    c = append("d3", 20, 30, part("p3"))
    h = head.header
    assert tr.apply(h, live, c, stamp()) == tr.compare_and_append(h, live, c, stamp())
    assert tr.apply(h, live, compaction(), stamp()) == tr.apply_compaction(h, live, compaction(), stamp())
    s = SinceCommand(None, 15)
    assert tr.apply(h, live, s, stamp()) == tr.advance_since(h, live, s, stamp())
    r = RetentionCommand(5)
    assert tr.apply(h, live, r, stamp()) == tr.set_retention(h, live, r, stamp())
    e = EvolveToCommand(target=WIDER)
    assert tr.apply(h, live, e, stamp()) == tr.evolve_to_target(h, live, e, stamp())
    assert [v.commit.kind for v in (step(head, live, c), step(head, live, append("x", 20, None)),
                                    step(head, live, compaction()), step(head, live, s), step(head, live, r),
                                    step(head, live, e))] == [
        "append", "close", "compact", "since", "retention", "schema"]


# --- (b) every kind's refusal is typed -------------------------------------------------------

def test_each_command_kind_refuses_with_a_typed_refusal() -> None:
    head, live = history()
    h = head.header
    assert tr.apply(h, live, create(), stamp()) == tr.AlreadyExists()
    assert tr.apply(h, live, append("d1", 0, 10), stamp()) == tr.AlreadyCommitted(1)
    assert tr.apply(h, live, append("d3", 10, 30), stamp()) == tr.UpperMismatch(20)
    assert tr.apply(h, live, compaction(inputs=("d1", "gone")), stamp()) == tr.InputsGone(("gone",))
    merged = step(head, live, compaction())
    assert tr.apply(merged.header, tr.apply_diffs(live, [merged]), compaction(), stamp()) == tr.AlreadyCommitted(3)
    assert isinstance(tr.apply(h, live, SinceCommand(None, None), stamp()), tr.Unchanged)
    assert isinstance(tr.apply(h, live, RetentionCommand(None), stamp()), tr.Unchanged)
    evolved = step(head, live, EvolveToCommand(target=WIDER))
    assert tr.apply(evolved.header, live, EvolveToCommand(target=WIDER), stamp()) == tr.Unchanged(
        "schema 1 already holds the target", schema_id=1)
    assert tr.apply(evolved.header, live, EvolveToCommand(target=SCHEMA, exact=True), stamp()) == tr.Unchanged(
        "schema 0 already holds the target", schema_id=0)  # an exact target some older id equals
    clash = pa.schema([("k", pa.string()), ("n", pa.string())])
    assert tr.apply(evolved.header, live, EvolveToCommand(target=clash), stamp()) == tr.SchemaConflict(
        1, "n", "needs column 'n' as string, but the shard's is int64")
    more = pa.schema([*WIDER, ("z", pa.int8())])
    refused = tr.apply(evolved.header, live, EvolveToCommand(target=pa.schema([*SCHEMA, ("z", pa.int8())]),
                                                             exact=True), stamp())
    assert isinstance(refused, tr.SchemaConflict) and (refused.schema_id, refused.column) == (1, "k"), refused
    assert isinstance(tr.apply(evolved.header, live, EvolveToCommand(target=more, exact=True), stamp()), st.Version)
    with pytest.raises(InvalidUsageError, match="needs an existing shard"):
        tr.apply(None, (), append("d1", 0, 10), stamp())


# --- (c) creating a shard goes through the one loop ------------------------------------------

class _LostCreates:
    """A store whose creates of ``key`` lose their answer: the first ``lost`` creates apply
    and then raise UnknownOutcomeError; ``before`` more raise it without applying;
    ``rival`` (if set) is written at ``key`` by "someone else" just before our first create."""

    def __init__(self, inner: Blob, key: str, *, lost: int = 0, before: int = 0, rival: bytes | None = None) -> None:
        self.inner, self.url, self.key = inner, inner.url, key
        self.lost, self.before, self.rival = lost, before, rival
        self.creates = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, data: bytes) -> str:
        if key != self.key:
            return self.inner.create(key, data)
        self.creates += 1
        if self.rival is not None:
            self.inner.create(key, self.rival)
            self.rival = None
            raise UnknownOutcomeError(f"PUT {key}: read timeout")
        if self.before > 0:
            self.before -= 1
            raise UnknownOutcomeError(f"PUT {key}: 503 before forwarding")
        etag = self.inner.create(key, data)
        if self.lost > 0:
            self.lost -= 1
            raise UnknownOutcomeError(f"PUT {key}: answer dropped")
        return etag


def _machine(blob: Any, sleeps: list[float], policy: RetryPolicy = COMMIT, *, nonce: str = "n") -> Machine:
    m = Machine(blob, storage_policy=STORAGE.with_sleep(sleeps.append), commit_policy=policy.with_sleep(sleeps.append))
    m.new_nonce = lambda: nonce
    return m


V0 = "state/v/00000000000000000000.json"


def test_a_second_create_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    blob = LocalBlob(tmp_path)
    first = _machine(blob, [], nonce="mine").commit(create())
    assert isinstance(first, st.Version) and first.seqno == 0
    assert _machine(blob, [], nonce="other").commit(create()) == tr.AlreadyExists()
    with pytest.raises(ShardExistsError, match="already exists"):
        Shard.create(tmp_path.as_uri(), SCHEMA, blob=blob)
    assert Shard.open(tmp_path.as_uri(), blob=blob).info().last_commit.nonce == "mine"


def test_a_create_whose_answer_is_lost_is_recognised_as_ours(tmp_path: Path) -> None:
    sleeps: list[float] = []
    lossy = _LostCreates(LocalBlob(tmp_path), V0, lost=1)
    out = _machine(lossy, sleeps, nonce="mine").commit(create())
    assert isinstance(out, st.Version) and out.commit.nonce == "mine"
    assert lossy.creates == 1, "version 0 was read back and recognised by its nonce: no second create"
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= COMMIT.first_wait
    assert Shard.open(tmp_path.as_uri()).info().last_commit.nonce == "mine"


def test_a_create_whose_answer_is_lost_through_shard_create_is_created(tmp_path: Path) -> None:
    lossy = _LostCreates(LocalBlob(tmp_path), V0, lost=1)
    shard = Shard.create(tmp_path.as_uri(), SCHEMA, upper=5, blob=lossy)  # type: ignore[arg-type]
    assert (shard.info().seqno, shard.info().upper) == (0, 5)


def test_a_create_that_did_not_apply_is_retried_identically(tmp_path: Path) -> None:
    sleeps: list[float] = []
    lossy = _LostCreates(LocalBlob(tmp_path), V0, before=2)
    out = _machine(lossy, sleeps, nonce="mine").commit(create())
    assert isinstance(out, st.Version) and out.commit.nonce == "mine"
    assert lossy.creates == 3 and len(sleeps) == 2


def test_a_lost_create_that_finds_someone_elses_version_0_is_refused(tmp_path: Path) -> None:
    rival = tr.apply(None, (), create(), stamp("theirs"))
    assert isinstance(rival, st.Version)
    from shardsink.core.state_codec import encode_version

    lossy = _LostCreates(LocalBlob(tmp_path), V0, rival=encode_version(rival))
    assert _machine(lossy, [], nonce="mine").commit(create()) == tr.AlreadyExists()
    assert Shard.open(tmp_path.as_uri()).info().last_commit.nonce == "theirs"


# --- (d) the loop's waits: the policy's, jittered, within its deadline -----------------------

def test_the_commit_loops_waits_are_jittered_and_bounded_by_the_policys_deadline(tmp_path: Path) -> None:
    Shard.create(tmp_path.as_uri(), SCHEMA)
    policy = RetryPolicy("test", attempts=50, first_wait=0.5, max_wait=2.0, deadline=6.0)
    sleeps: list[float] = []
    never = _LostCreates(LocalBlob(tmp_path), "state/v/00000000000000000001.json", before=10**6)
    with pytest.raises(UnknownOutcomeError, match="did not settle"):
        _machine(never, sleeps, policy).commit(append("d1", 0, 10))
    assert sum(sleeps) <= policy.deadline + 1e-9, "the deadline bounds the time waited"
    assert 0 < len(sleeps) < policy.attempts, "the deadline, not the attempts, ended it"
    assert never.creates == len(sleeps) + 1, "after the last wait, one more identical create, then give up"
    caps = [min(policy.max_wait, policy.first_wait * 2**i) for i in range(len(sleeps))]
    assert all(0 <= s <= c for s, c in zip(sleeps, caps, strict=True)), (sleeps, caps)
    assert sleeps != caps and len(set(sleeps)) == len(sleeps), "full jitter, not a fixed exponential"


def test_policy_waits_stop_at_attempts_or_at_the_deadline_on_the_clock() -> None:
    assert len(list(RetryPolicy("n", attempts=5, first_wait=0.01, max_wait=0.02, deadline=60.0).waits())) == 5
    ticks = itertools.count(0.0, 4.0)  # each look at the clock: 4 s later
    clock: Callable[[], float] = lambda: next(ticks)  # noqa: E731
    waits = list(RetryPolicy("c", attempts=50, first_wait=0.01, max_wait=0.02, deadline=10.0).waits(clock=clock))
    assert len(waits) == 2, "started at 0, looked at 4 and 8, then 12 is past the deadline"


class _LateCreates:
    """A store whose first create of ``key`` loses its answer WITHOUT applying, and then lands
    late: just after the writer's re-read of ``key`` (which finds nothing)."""

    def __init__(self, inner: Blob, key: str) -> None:
        self.inner, self.url, self.key = inner, inner.url, key
        self.pending: bytes | None = None
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str) -> Any:
        got = self.inner.get(key)
        if key == self.key and self.pending is not None:
            self.inner.create(key, self.pending)  # lands after the read saw nothing
            self.pending = None
        return got

    def create(self, key: str, data: bytes) -> str:
        if key == self.key and self.armed:
            self.armed, self.pending = False, data
            raise UnknownOutcomeError(f"PUT {key}: read timeout")
        return self.inner.create(key, data)


def test_an_own_create_that_lands_after_the_re_read_is_committed_not_refused(tmp_path: Path) -> None:
    """A retention commit (not idempotent: re-applied on its own version it is Unchanged) whose
    create lands only after the re-read: the retried create is refused by OUR version, which
    must be recognised by its nonce and reported committed, never 'unchanged'."""
    blob = LocalBlob(tmp_path)
    assert isinstance(Machine(blob).commit(create()), st.Version)
    late = _LateCreates(blob, "state/v/00000000000000000001.json")
    sleeps: list[float] = []
    out = _machine(late, sleeps, nonce="ret-1").commit(RetentionCommand(1000))
    assert isinstance(out, st.Version) and (out.seqno, out.commit.nonce) == (1, "ret-1"), out
    assert out.header.retention == 1000
    assert Shard.open(tmp_path.as_uri(), blob=blob).info().last_commit.nonce == "ret-1"
