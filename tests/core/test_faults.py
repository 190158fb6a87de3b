"""Fault injection against S3: the commit stays exactly-once whatever the network does.

Every test runs the real library against a real S3 endpoint (moto, over HTTP) through
:class:`support.faultproxy.FaultProxy`, which drops answers, answers errors before or
after forwarding, or delays past the client's read timeout, on exactly the request the
test names. After each scenario :func:`support.audit` compares the shard's objects with
an independent model of what the writer was told: the state versions are ``0..n``, each
description is in exactly one version, nothing referenced was deleted, and the data
equals the rows of the appends that reported success.

Backoff sleeps are injected (recorded, not slept) through the policies' ``with_sleep``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import SCHEMA, Audit, Row, audit, rows_for, snapshot_counter, table_of
from support.faultproxy import FaultProxy, fault_proxy

from shardsink import (
    AppendResult,
    Shard,
    ShardExistsError,
    StorageError,
    UnknownOutcomeError,
    UpperMismatchError,
)
from shardsink.core.machine import Machine
from shardsink.storage.retry import COMMIT, STORAGE
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import MotoServer

BUCKET = "shardsink-test"
#: Client read timeout in the timeout scenarios, and the injected delay beyond it.
READ_TIMEOUT = 1.0
DELAY = READ_TIMEOUT + 0.6


_CLIENTS: dict[tuple[str, str | None], Any] = {}


def client(endpoint: str) -> Any:
    """One boto3 client per endpoint and read timeout (clients are slow to build, thread-safe)."""
    key = (endpoint, os.environ.get("SHARDSINK_S3_READ_TIMEOUT"))
    if key not in _CLIENTS:
        _CLIENTS[key] = make_client(endpoint_url=endpoint)
    return _CLIENTS[key]


def vkey(seqno: int) -> str:
    return rf"state/v/{seqno:020d}\.json$"


class Rig:
    """One fresh S3 shard, a faulty handle through the proxy, a direct one, and the model."""

    def __init__(self, proxy: FaultProxy, moto: MotoServer) -> None:
        self.proxy = proxy
        self.prefix = f"faults-{uuid.uuid4().hex[:12]}"
        self.url = f"s3://{BUCKET}/{self.prefix}"
        self.direct = S3Blob(BUCKET, self.prefix, client=client(moto.endpoint))
        Shard.create(self.url, SCHEMA, blob=self.direct)
        self.sleeps: list[float] = []
        self.model: dict[str, list[Row]] = {}
        self.bounds: dict[str, tuple[int, int]] = {}
        self.upper = 0
        self.shard = self.handle()

    def handle(self) -> Shard:
        """A shard handle whose every request goes through the proxy; backoff is not slept."""
        blob = S3Blob(BUCKET, self.prefix, client=client(self.proxy.url))
        machine = Machine(blob, storage_policy=STORAGE.with_sleep(self.sleeps.append),
                          commit_policy=COMMIT.with_sleep(self.sleeps.append))
        return Shard(self.url, machine=machine)

    def rows(self, desc_id: str) -> tuple[int, int, list[Row]]:
        """The batch of ``desc_id``: new at the current upper, or the same one again (a retry)."""
        if desc_id not in self.bounds:
            self.bounds[desc_id] = (self.upper, self.upper + 10)
        lower, upper = self.bounds[desc_id]
        return lower, upper, rows_for(desc_id, lower, upper)

    def append(self, desc_id: str, *, shard: Shard | None = None) -> AppendResult:
        """Append (or re-append) ``desc_id``; record it in the model if it reports success."""
        lower, upper, rows = self.rows(desc_id)
        r = (shard or self.shard).append(table_of(rows), lower=lower, upper=upper, desc_id=desc_id)
        assert r.status in ("committed", "already_committed")
        assert (r.lower, r.upper) == (lower, upper)
        self.model[desc_id] = rows
        self.upper = max(self.upper, upper)
        return r

    def competitor(self, desc_id: str) -> Callable[[], None]:
        """An action: another writer (not through the proxy) commits at the shard's upper."""

        def act() -> None:
            other = Shard(self.url, blob=self.direct)
            upper = other.info().upper
            assert upper is not None
            self.bounds[desc_id] = (upper, upper + 10)
            self.append(desc_id, shard=other)

        return act

    def audit(self) -> Audit:
        self.proxy.wait_idle()
        self.proxy.clear_rules()
        return audit(self.direct, self.model, url=self.url)


@pytest.fixture(scope="module")
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with fault_proxy(moto.endpoint) as p:
        yield p


@pytest.fixture
def make_rig(proxy: FaultProxy, moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Rig]]:
    def make(*, read_timeout: float | None = None) -> Rig:
        if read_timeout is not None:
            monkeypatch.setenv("SHARDSINK_S3_READ_TIMEOUT", str(read_timeout))
        return Rig(proxy, moto)

    proxy.clear()
    yield make
    proxy.wait_idle()
    proxy.clear()


def _needs_timeout(fault: dict[str, Any]) -> float | None:
    return READ_TIMEOUT if fault["kind"] == "delay" else None


# --- the conditional put of state/v/<n>.json --------------------------------------------

APPLIED_BUT_UNACKNOWLEDGED = [
    pytest.param({"kind": "drop_response_after_forward"}, id="response-dropped"),
    pytest.param({"kind": "status_after_forward", "status": 500}, id="500-after-applied"),
    pytest.param({"kind": "status_after_forward", "status": 503}, id="503-after-applied"),
    pytest.param({"kind": "status_after_forward", "status": 409}, id="409-after-applied"),
    pytest.param({"kind": "delay", "seconds": DELAY, "phase": "after"}, id="timeout-after-applied"),
]


@pytest.mark.parametrize("fault", APPLIED_BUT_UNACKNOWLEDGED)
def test_version_put_applied_but_unacknowledged_is_recognised_as_ours_and_committed_once(
    make_rig: Callable[..., Rig], fault: dict[str, Any]
) -> None:
    rig = make_rig(read_timeout=_needs_timeout(fault))
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add(method="PUT", key=vkey(2), header="If-None-Match", **fault)

    r = rig.append("lost-ack")

    assert (r.status, r.seqno) == ("committed", 2)
    puts = rig.proxy.requests("PUT", vkey(2), header="If-None-Match")
    assert [p.upstream_status for p in puts] == [200], "resolved by re-reading, never by putting again"
    rereads = [g for g in rig.proxy.requests("GET", vkey(2)) if g.seq > puts[0].seq]
    assert rereads, "the unknown outcome was resolved by re-reading v/2"
    again = rig.append("lost-ack")  # the caller never saw the ack and retries the whole append
    assert (again.status, again.seqno) == ("already_committed", 2)
    a = rig.audit()
    assert a.seqno == 2 and a.seqno_of("lost-ack") == 2
    assert a.leaked == set()


NOT_APPLIED = [
    pytest.param({"kind": "status_before_forward", "status": 409}, id="409-before"),
    pytest.param({"kind": "status_before_forward", "status": 500}, id="500-before"),
    pytest.param({"kind": "status_before_forward", "status": 503}, id="503-before"),
    # Held by the proxy past the client's read timeout, forwarded only after the retry won.
    pytest.param({"kind": "call_before_forward"}, id="timeout-then-arrives-late"),
]


@pytest.mark.parametrize("fault", NOT_APPLIED)
def test_version_put_with_unknown_outcome_that_did_not_apply_is_retried_and_commits_once(
    make_rig: Callable[..., Rig], fault: dict[str, Any]
) -> None:
    late = fault["kind"] == "call_before_forward"
    rig = make_rig(read_timeout=READ_TIMEOUT if late else None)
    rig.append("first")
    rig.proxy.clear()

    def after_the_retry_landed() -> None:
        assert rig.proxy.wait_for(lambda: [p.upstream_status for p in rig.proxy.requests("PUT", vkey(2))][1:] == [200])

    rig.proxy.add(method="PUT", key=vkey(2), header="If-None-Match", **fault,
                  **({"action": after_the_retry_landed} if late else {}))

    r = rig.append("second")

    assert (r.status, r.seqno) == ("committed", 2)
    rig.proxy.wait_idle()  # the held first put reaches S3 only now
    puts = rig.proxy.requests("PUT", vkey(2), header="If-None-Match")
    assert len(puts) == 2
    if late:
        # The retry won; the first put arrived late and If-None-Match refused it.
        assert sorted(p.upstream_status or 0 for p in puts) == [200, 412]
    else:
        assert [p.upstream_status for p in puts] == [None, 200]
    a = rig.audit()
    assert a.seqno == 2 and a.seqno_of("second") == 2
    assert a.leaked == set()


def test_own_put_landing_after_the_reread_makes_the_retry_fail_412_and_is_still_recognised_as_committed(
    make_rig: Callable[..., Rig],
) -> None:
    """The slowest interleaving: put #1 times out, the re-read finds nothing, put #1 lands
    only then, and the identical put #2 is refused 412 by our own version."""
    rig = make_rig(read_timeout=READ_TIMEOUT)
    rig.append("first")
    rig.proxy.clear()
    reread_done = threading.Event()

    def first_put_lands_after_the_reread() -> None:
        assert reread_done.wait(30)

    def second_put_after_the_first_landed() -> None:
        assert rig.proxy.wait_for(lambda: rig.proxy.requests("PUT", vkey(2))[0].upstream_status is not None)

    def note_reread() -> None:
        if rig.proxy.count("PUT", vkey(2)) >= 1:
            reread_done.set()

    rig.proxy.add("call_before_forward", method="PUT", key=vkey(2), header="If-None-Match", nth=1,
                  action=first_put_lands_after_the_reread)
    rig.proxy.add("call_before_forward", method="PUT", key=vkey(2), header="If-None-Match", nth=2,
                  action=second_put_after_the_first_landed)
    rig.proxy.add("delay", method="GET", key=vkey(2), seconds=0.0, times=None, action=note_reread)

    r = rig.append("late")

    assert (r.status, r.seqno) == ("committed", 2), "our own version, not someone's earlier commit"
    rig.proxy.wait_idle()
    assert [p.upstream_status for p in rig.proxy.requests("PUT", vkey(2))] == [200, 412]
    a = rig.audit()
    assert a.seqno == 2 and a.seqno_of("late") == 2
    assert a.leaked == set()


def test_version_put_refused_412_as_if_another_writer_won_rereads_and_commits_once(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add("status_before_forward", method="PUT", key=vkey(2), header="If-None-Match", status=412)

    r = rig.append("second")

    assert (r.status, r.seqno) == ("committed", 2)
    assert [p.client_status for p in rig.proxy.requests("PUT", vkey(2))] == [412, 200]
    put_412 = rig.proxy.requests("PUT", vkey(2))[0]
    gets = [g for g in rig.proxy.requests("GET", vkey(2)) if g.seq > put_412.seq]
    assert gets, "re-read v/2 after the 412 (the create is the append's probe)"
    assert rig.audit().leaked == set()


@pytest.mark.parametrize("delete_fault", [False, True], ids=["clean-deletes", "deletes-fail-once"])
def test_race_lost_at_the_conditional_put_raises_upper_mismatch_and_deletes_only_its_own_parts(
    make_rig: Callable[..., Rig], delete_fault: bool
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    # Another writer commits v/2 just before our conditional put of v/2 reaches S3.
    rig.proxy.add("call_before_forward", method="PUT", key=vkey(2), header="If-None-Match",
                  action=rig.competitor("winner"))
    if delete_fault:
        rig.proxy.add("status_after_forward", method="DELETE", key=r"/parts/", status=500)

    with pytest.raises(UpperMismatchError) as e:
        rig.append("loser")

    assert "loser" not in rig.model
    assert e.value.expected == 10 and e.value.current == 20
    assert [p.upstream_status for p in rig.proxy.requests("PUT", vkey(2), header="If-None-Match")] == [412]
    assert rig.proxy.count("DELETE", r"/parts/loser/") >= 1
    a = rig.audit()
    assert a.seqno_of("winner") == 2
    assert a.leaked == set(), "the loser's staged parts were deleted"
    assert not any(k.startswith("parts/loser/") for k in a.parts)


def test_unknown_outcome_resolved_as_someone_elses_version_is_a_clean_upper_mismatch(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    # Our put fails with 503 (not applied) and meanwhile another writer takes v/2.
    rig.proxy.add("status_before_forward", method="PUT", key=vkey(2), header="If-None-Match", status=503,
                  action=rig.competitor("winner"))

    with pytest.raises(UpperMismatchError) as e:
        rig.append("loser")

    assert "loser" not in rig.model
    assert e.value.current == 20
    a = rig.audit()
    assert a.seqno == 2 and a.seqno_of("winner") == 2
    assert a.leaked == set()


def test_lost_ack_then_another_writer_commits_on_top_still_reports_committed(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    # Our v/2 lands, its answer is lost, and another writer commits v/3 before we re-read.
    rig.proxy.add("drop_response_after_forward", method="PUT", key=vkey(2), header="If-None-Match",
                  action=rig.competitor("on-top"))

    r = rig.append("ours")

    assert (r.status, r.seqno) == ("committed", 2)
    a = rig.audit()
    assert (a.seqno_of("ours"), a.seqno_of("on-top")) == (2, 3)
    assert a.leaked == set()


# --- escaping unknown outcomes, and the caller's retry -------------------------------------


def test_unknown_outcome_that_landed_escapes_as_unknown_and_the_retry_is_already_committed(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    # v/2 lands but the answer is a 500; from then on every read of v/2 fails.
    def reads_fail() -> None:
        rig.proxy.add("status_before_forward", method="GET", key=vkey(2), times=None, status=503)

    rig.proxy.add("status_after_forward", method="PUT", key=vkey(2), header="If-None-Match", status=500,
                  action=reads_fail)

    with pytest.raises(UnknownOutcomeError):
        rig.append("landed")
    assert rig.proxy.requests("PUT", vkey(2))[0].upstream_status == 200

    rig.proxy.clear_rules()
    r = rig.append("landed")

    assert (r.status, r.seqno) == ("already_committed", 2)
    a = rig.audit()
    assert a.seqno == 2 and a.seqno_of("landed") == 2
    assert a.leaked == set(), "the retry staged nothing; the first attempt's parts are the committed ones"


def test_unknown_outcome_that_did_not_land_escapes_and_the_retry_commits_once(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add("status_before_forward", method="PUT", key=vkey(2), header="If-None-Match", status=503,
                  times=None)

    with pytest.raises(UnknownOutcomeError):
        rig.append("unsure")
    assert rig.proxy.count("PUT", vkey(2)) == COMMIT.attempts, "bounded: the commit policy's attempts"
    stale = {o.key for o in rig.direct.list("parts/unsure/")}
    assert stale, "parts of an unknown outcome are never cleaned up blindly"

    rig.proxy.clear_rules()
    r = rig.append("unsure")

    assert (r.status, r.seqno) == ("committed", 2)
    a = rig.audit()
    assert a.seqno_of("unsure") == 2
    assert a.leaked == stale, "only the first attempt's parts are unreferenced (left for GC)"


def test_discard_after_an_unknown_outcome_that_landed_never_deletes_the_committed_parts(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    lower, upper, rows = rig.rows("staged-once")
    staged = rig.shard.stage(table_of(rows), lower=lower, upper=upper, desc_id="staged-once")

    def reads_fail() -> None:
        rig.proxy.add("status_before_forward", method="GET", key=vkey(2), times=None, status=500)

    rig.proxy.add("drop_response_after_forward", method="PUT", key=vkey(2), header="If-None-Match",
                  action=reads_fail)
    with pytest.raises(UnknownOutcomeError):
        rig.shard.compare_and_append([staged], expected_upper=lower, new_upper=upper, desc_id="staged-once")
    rig.proxy.clear_rules()

    # The caller retries the same staged batch, then cleans up as a lost race would.
    r = rig.shard.compare_and_append([staged], expected_upper=lower, new_upper=upper, desc_id="staged-once")
    assert (r.status, r.seqno) == ("already_committed", 2)
    assert rig.shard.discard([staged]) == 0, "every staged part is referenced by the committed batch"
    rig.model["staged-once"] = rows
    a = rig.audit()
    assert a.referenced >= {p.key for p in staged.parts}
    assert a.leaked == set()


def test_retry_through_stage_and_compare_and_append_after_a_lost_ack_discards_only_its_new_parts(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add("drop_response_after_forward", method="PUT", key=vkey(2), header="If-None-Match")
    rig.append("twice")
    committed_parts = set(rig.audit().referenced)

    lower, upper, rows = rig.rows("twice")
    staged = rig.shard.stage(table_of(rows), lower=lower, upper=upper, desc_id="twice")
    r = rig.shard.compare_and_append([staged], expected_upper=lower, new_upper=upper, desc_id="twice")
    assert (r.status, r.seqno) == ("already_committed", 2)
    assert rig.shard.discard([staged]) == len(staged.parts)

    a = rig.audit()
    assert a.referenced == committed_parts
    assert a.leaked == set()


# --- idempotent requests: part puts and reads ------------------------------------------------

TRANSIENT = [
    pytest.param({"kind": "drop_response_after_forward"}, id="response-dropped"),
    pytest.param({"kind": "status_before_forward", "status": 500}, id="500-before"),
    pytest.param({"kind": "status_before_forward", "status": 409}, id="409-before"),
    pytest.param({"kind": "status_after_forward", "status": 503}, id="503-after"),
    pytest.param({"kind": "delay", "seconds": DELAY, "phase": "after"}, id="timeout-after"),
]


@pytest.mark.parametrize("fault", TRANSIENT)
def test_faults_on_part_puts_are_retried_on_the_same_key_and_the_append_commits_once(
    make_rig: Callable[..., Rig], fault: dict[str, Any]
) -> None:
    rig = make_rig(read_timeout=_needs_timeout(fault))
    rig.proxy.add(method="PUT", key=r"/parts/", **fault)

    r = rig.append("batch")

    assert (r.status, r.seqno) == ("committed", 1)
    puts = rig.proxy.requests("PUT", r"/parts/")
    assert len(puts) == 2 and puts[0].key == puts[1].key, "a part put is retried with its own fresh key"
    assert rig.sleeps, "the retry backed off through the storage policy"
    a = rig.audit()
    assert a.leaked == set()


READS = [
    pytest.param("state/LATEST.json$", {"kind": "status_before_forward", "status": 500}, id="hint-500"),
    pytest.param("state/LATEST.json$", {"kind": "status_before_forward", "status": 503, "times": 3},
                 id="hint-503x3"),
    pytest.param("state/LATEST.json$", {"kind": "drop_response_after_forward"}, id="hint-dropped"),
    pytest.param("state/LATEST.json$", {"kind": "delay", "seconds": DELAY}, id="hint-timeout"),
    pytest.param(vkey(2), {"kind": "status_before_forward", "status": 503, "times": 2}, id="probe-503x2"),
    pytest.param(vkey(2), {"kind": "drop_response_after_forward"}, id="probe-dropped"),
]


@pytest.mark.parametrize(("key", "fault"), READS)
def test_faults_on_state_reads_are_retried_and_the_append_commits_once(
    make_rig: Callable[..., Rig], key: str, fault: dict[str, Any]
) -> None:
    rig = make_rig(read_timeout=_needs_timeout(fault))
    if key == vkey(2):
        # An append trusts a hint that matches its lower and probes no further (its create is
        # the probe); it probes past a stale hint, e.g. one a crashed writer left behind.
        rig.proxy.add("status_before_forward", method="PUT", key="state/LATEST.json$", status=412)
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add(method="GET", key=key, **fault)

    # A fresh handle, as the next Airflow task has (a warm one starts from the head it committed).
    r = rig.append("second", shard=rig.handle())

    assert (r.status, r.seqno) == ("committed", 2)
    assert rig.proxy.requests("GET", key)[0].fault == fault["kind"]
    a = rig.audit()
    assert a.seqno == 2 and a.leaked == set()


@pytest.mark.parametrize("fault", TRANSIENT)
def test_faults_on_part_reads_are_retried_and_the_snapshot_is_exact(
    make_rig: Callable[..., Rig], fault: dict[str, Any]
) -> None:
    rig = make_rig(read_timeout=_needs_timeout(fault))
    for i in range(3):
        rig.append(f"b{i}")
    rig.proxy.add(method="GET", key=r"/parts/", **fault)

    got = snapshot_counter(rig.shard.snapshot())

    assert got == {(k, n): 1 for rows in rig.model.values() for k, n, _, _ in rows}
    assert rig.proxy.requests("GET", r"/parts/", fault=fault["kind"])
    rig.audit()


HINT = [
    pytest.param({"kind": "drop_response_after_forward"}, id="response-dropped"),
    pytest.param({"kind": "status_before_forward", "status": 500}, id="500-before"),
    pytest.param({"kind": "status_after_forward", "status": 503}, id="503-after-applied"),
    pytest.param({"kind": "status_before_forward", "status": 412}, id="412-newer-hint"),
]


@pytest.mark.parametrize("fault", HINT)
def test_failed_hint_updates_never_lose_or_duplicate_commits(
    make_rig: Callable[..., Rig], fault: dict[str, Any]
) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()
    rig.proxy.add(method="PUT", key="state/LATEST.json$", header="If-Match", times=2, **fault)

    assert rig.append("second").seqno == 2
    assert rig.append("third", shard=rig.handle()).seqno == 3  # a fresh handle probes past a stale hint
    assert rig.append("second", shard=rig.handle()).status == "already_committed"
    a = rig.audit()
    assert a.seqno == 3 and a.leaked == set()


# --- chaos: random faults on every kind of request ---------------------------------------------


def test_sequential_appends_under_random_faults_on_all_requests_are_exactly_once(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer retries each append with the same description id until it reports success."""
    with fault_proxy(moto.endpoint, seed=20240611) as chaos:
        rig = Rig(chaos, moto)
        for kind, extra, p in [
            ("drop_response_after_forward", {}, 0.05),
            ("status_before_forward", {"status": 503}, 0.05),
            ("status_after_forward", {"status": 500}, 0.05),
            ("status_before_forward", {"status": 409}, 0.03),
        ]:
            chaos.add(kind, method="*", key=".*", times=None, probability=p, **extra)
        unsure: set[str] = set()
        for i in range(14):
            desc = f"c{i}"
            for _ in range(10):
                try:
                    rig.append(desc)
                    break
                except (UnknownOutcomeError, StorageError):
                    unsure.add(desc)
            else:
                pytest.fail(f"{desc} did not commit in 10 attempts")
            if i % 3 == 0:
                with contextlib.suppress(UnknownOutcomeError, StorageError):
                    assert rig.append(desc).status == "already_committed"
        faults = len([r for r in chaos.requests() if r.fault])
        assert faults >= 5, f"the chaos run injected only {faults} faults"
        a = rig.audit()
    assert a.seqno == 14
    assert [c["desc_id"] for c in a.commits] == [f"c{i}" for i in range(14)]
    assert all(k.split("/")[1] in unsure for k in a.leaked), "only unknown outcomes may leave parts behind"


# --- creating a shard ----------------------------------------------------------------------------

CREATE = [
    pytest.param({"kind": "drop_response_after_forward"}, True, id="response-dropped"),
    pytest.param({"kind": "status_after_forward", "status": 500}, True, id="500-after-applied"),
    pytest.param({"kind": "status_before_forward", "status": 503}, False, id="503-before"),
    pytest.param({"kind": "status_before_forward", "status": 409}, False, id="409-before"),
]


@pytest.mark.parametrize(("fault", "applied"), CREATE)
def test_create_with_an_unknown_outcome_is_resolved_by_rereading_version_0(
    proxy: FaultProxy, moto: MotoServer, fault: dict[str, Any], applied: bool
) -> None:
    proxy.clear()
    prefix = f"faults-create-{uuid.uuid4().hex[:12]}"
    url = f"s3://{BUCKET}/{prefix}"
    proxy.add(method="PUT", key=vkey(0), header="If-None-Match", **fault)

    shard = Shard.create(url, SCHEMA, blob=S3Blob(BUCKET, prefix, client=client(proxy.url)))

    assert shard.info().seqno == 0
    puts = proxy.requests("PUT", vkey(0), header="If-None-Match")
    assert [p.upstream_status for p in puts] == ([200] if applied else [None, 200])
    direct = S3Blob(BUCKET, prefix, client=client(moto.endpoint))
    with pytest.raises(ShardExistsError):
        Shard.create(url, SCHEMA, blob=direct)  # another create is refused, and changes nothing
    assert audit(direct, {}, url=url).seqno == 0


def test_uncontended_append_costs_4_requests_fresh_and_3_warm(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.append("first")
    rig.proxy.clear()

    task = rig.handle()  # a fresh handle, as an Airflow task has
    r = rig.append("second", shard=task)

    assert (r.status, r.seqno) == ("committed", 2)

    def sent() -> list[tuple[str, str]]:
        got = [(q.method, q.key.split("/state/")[-1] if "/state/" in q.key else "part") for q in rig.proxy.requests()]
        rig.proxy.clear()
        return got

    assert sent() == [("GET", "LATEST.json"), ("PUT", "part"), ("PUT", "v/00000000000000000002.json"),
                      ("PUT", "LATEST.json")], "hint, part, conditional create (the probe), hint CAS"
    r = rig.append("third", shard=task)  # the same handle moments later starts from the head it committed
    assert (r.status, r.seqno) == ("committed", 3)
    assert sent() == [("PUT", "part"), ("PUT", "v/00000000000000000003.json"), ("PUT", "LATEST.json")]
    r = rig.append("fourth")  # the rig's first handle: its known head (seqno 1) is stale, so it re-reads
    assert (r.status, r.seqno) == ("committed", 4)
    assert sent()[:2] == [("GET", "LATEST.json"), ("GET", "v/00000000000000000004.json")]
    assert rig.audit().leaked == set()
