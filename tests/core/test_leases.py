"""Read leases: acquire / renew / release / expiry, the since check, and the keeper."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest

from shardsink import CorruptionError, LeaseLostError, ReadFrontierError, Shard, ShardNotFoundError
from shardsink.core import leases as ls

SCHEMA = pa.schema([("k", pa.string())])


@pytest.fixture
def shard(shard_url: str) -> Shard:
    s = Shard.create(shard_url, SCHEMA, upper=10)
    s.append(pa.table({"k": ["a"], "_time": [12]}), lower=10, upper=20)
    return s


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_acquire_list_release(shard: Shard) -> None:
    clock = Clock()
    a = ls.acquire(shard, 15, holder="job-a", ttl_s=60, clock=clock)
    b = ls.acquire(shard, 12, holder="job-b", ttl_s=60, clock=clock)
    assert (a.seqno, a.as_of, a.holder, a.expires_at) == (1, 15, "job-a", 1_060.0)
    assert {x.lease_id for x in shard.leases(now=clock.t)} == {a.lease_id, b.lease_id}
    assert shard.min_leased_as_of(now=clock.t) == 12
    ls.release(shard, b)
    ls.release(shard, b)  # idempotent
    assert shard.min_leased_as_of(now=clock.t) == 15
    ls.release(shard, a)
    assert shard.leases(now=clock.t) == [] and shard.min_leased_as_of(now=clock.t) is None


def test_expiry_renewal_and_skew_margin(shard: Shard) -> None:
    clock = Clock()
    lease = ls.acquire(shard, 15, holder="h", ttl_s=60, clock=clock)
    clock.t += 50
    lease = ls.renew(shard, lease, ttl_s=60, clock=clock)
    assert lease.expires_at == 1_110.0
    assert ls.live_leases(shard, now=1_110.0 + ls.CLOCK_SKEW_S) == [lease]  # still live within the margin
    assert ls.live_leases(shard, now=1_111.0 + ls.CLOCK_SKEW_S) == []
    assert ls.expire(shard, now=1_111.0) == 0
    assert ls.expire(shard, now=1_111.0 + ls.CLOCK_SKEW_S) == 1
    assert ls.all_leases(shard) == []


def test_renewing_a_lost_lease_raises(shard: Shard) -> None:
    clock = Clock()
    lease = ls.acquire(shard, 15, holder="h", ttl_s=10, clock=clock)
    clock.t += 11
    with pytest.raises(LeaseLostError, match="expired before renewal"):
        ls.renew(shard, lease, ttl_s=10, clock=clock)
    assert ls.all_leases(shard) == []  # released on the way
    other = ls.acquire(shard, 15, holder="h", ttl_s=10, clock=clock)
    ls.release(shard, other)
    with pytest.raises(LeaseLostError, match="deleted"):
        ls.renew(shard, other, clock=clock)


def test_as_of_before_since_is_refused_and_leaves_nothing(shard: Shard, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    real_head = shard._machine.head
    calls = {"n": 0}

    def head_with_since(since: int):  # type: ignore[no-untyped-def]
        def head():  # type: ignore[no-untyped-def]
            calls["n"] += 1
            h = real_head()
            bumped = replace(h.version, header=replace(h.version.header, since=since(calls["n"])))
            return replace(h, version=bumped)
        return head

    monkeypatch.setattr(shard._machine, "head", head_with_since(lambda n: 14))
    with pytest.raises(ReadFrontierError, match=r"as_of 12 is not readable .* before since \(14\)"):
        ls.acquire(shard, 12, holder="h")
    assert ls.all_leases(shard) == []
    # A compactor advanced since between our first check and our lease: refused, lease released.
    calls["n"] = 0
    monkeypatch.setattr(shard._machine, "head", head_with_since(lambda n: 0 if n == 1 else 14))
    with pytest.raises(ReadFrontierError):
        ls.acquire(shard, 12, holder="h")
    assert ls.all_leases(shard) == []


def test_no_lease_written_for_a_missing_shard(tmp_path: object) -> None:
    with pytest.raises(ShardNotFoundError):
        ls.acquire(Shard(f"file://{tmp_path}/nothing"), 0, holder="h")
    assert not (tmp_path / "nothing").exists()  # type: ignore[operator]


def test_unreadable_lease_is_corruption(shard: Shard) -> None:
    shard._machine.blob.put("leases/bad.json", b"{not json")
    with pytest.raises(CorruptionError, match=r"leases/bad\.json: unreadable lease"):
        shard.leases()


def test_leases_read_through_the_one_document_decoder(shard: Shard) -> None:
    """A newer format is refused naming the object; unknown fields are ignored; a lease without
    ``format`` (the struct's default) reads as format 1."""
    doc = {"lease_id": "x", "as_of": 12, "seqno": 1, "holder": "h", "acquired_at": 1.0, "expires_at": 2.0}
    shard._machine.blob.put("leases/x.json", json.dumps({**doc, "later_field": [1]}).encode())
    assert [(x.lease_id, x.format) for x in ls.all_leases(shard)] == [("x", 1)]
    shard._machine.blob.put("leases/x.json", json.dumps({**doc, "format": 1}).encode())
    assert [x.as_of for x in ls.all_leases(shard)] == [12]
    shard._machine.blob.put("leases/x.json", json.dumps({**doc, "format": 2}).encode())
    with pytest.raises(CorruptionError, match=r"leases/x\.json: unsupported lease format 2 .*upgrade"):
        ls.all_leases(shard)


def test_keeper_renews_and_releases(shard: Shard) -> None:
    # A TTL a loaded machine cannot outrun (at 0.3 s a slow S3 renewal under a busy suite let the
    # lease expire); the thread renews every ttl/3 = 0.5 s, and the test waits for its first round.
    renewal = threading.Event()
    keeper = ls.LeaseKeeper(ttl_s=1.5, after_renewal=renewal.set)
    lease = keeper.acquire(shard, 15, holder="keeper")
    while keeper.leases()[0].expires_at == lease.expires_at:  # a round whose renewal failed is retried
        assert renewal.wait(60), "the keeper's thread stopped renewing"
        renewal.clear()
    (renewed,) = keeper.leases()
    assert renewed.lease_id == lease.lease_id and renewed.expires_at > lease.expires_at
    keeper.close()
    assert ls.all_leases(shard) == []


def test_keeper_reports_a_lost_lease(shard: Shard) -> None:
    keeper = ls.LeaseKeeper(ttl_s=60)
    lease = keeper.acquire(shard, 15, holder="keeper")
    ls.release(shard, lease)  # e.g. an operator expired it
    keeper.renew_all()
    with pytest.raises(LeaseLostError, match=lease.lease_id):
        keeper.close()


def test_a_lease_taken_from_the_tasks_version_reads_the_head_once_and_pins_that_read(shard: Shard) -> None:
    """The check before writing uses the version the task already read; the one head read is the
    re-check after the lease is written, and the leased read takes its parts from that version."""
    task = Shard(shard.url)
    v = task.reader().head()
    before = task.request_counter().by_kind[("get", "state")]
    lease, pinned = ls.acquire_pinned(task, v.header.upper - 1, holder="t", head=v)
    assert task.request_counter().by_kind[("get", "state")] - before == 1
    assert pinned.seqno >= v.seqno and lease.seqno == v.seqno
    assert [x.lease_id for x in ls.all_leases(shard)] == [lease.lease_id]
