"""The retry every store carries: :func:`open_blob` wraps each backend in a
:class:`RetryingBlob` whose policy retries idempotent requests (jittered, bounded, with an
injectable sleep) and never blindly retries a conditional write whose outcome is unknown;
:class:`StoreOptions` (from the environment, explicit, or an S3 access) reach the client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.faultproxy import FaultProxy, fault_proxy

from shardsink import Shard
from shardsink.errors import InvalidUsageError, StorageError, UnknownOutcomeError
from shardsink.storage import Blob, open_blob
from shardsink.storage.base import Fetched, ObjectInfo, SourceObject
from shardsink.storage.options import StoreOptions
from shardsink.storage.retry import STORAGE, RetryingBlob, RetryPolicy, key_class
from shardsink.storage.s3 import S3Access, S3Blob, make_client, using_s3_access
from shardsink_dev.testing import MotoServer

BUCKET = "shardsink-test"  # created by the session `moto` fixture in tests/conftest.py
VERSION_0 = "state/v/00000000000000000000.json"


class Flaky:
    """A backend whose next ``fail[method]`` calls raise ``error`` before reaching ``inner``."""

    def __init__(self, inner: Blob, error: Exception, **fail: int) -> None:
        self.inner, self.url, self.error, self.fail = inner, inner.url, error, dict(fail)

    def _maybe_fail(self, method: str) -> None:
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            raise self.error

    def get(self, key: str) -> Fetched | None:
        self._maybe_fail("get")
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def create(self, key: str, data: bytes) -> str:
        self._maybe_fail("create")
        return self.inner.create(key, data)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        return self.inner.replace(key, data, etag=etag)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def get_source(self, key: str) -> SourceObject | None:
        return self.inner.get_source(key)


def bound(policy: RetryPolicy, i: int) -> float:
    """The largest wait the policy may sleep after its ``i``-th failed try (0-based)."""
    return min(policy.max_wait, policy.first_wait * 2**i)


@pytest.fixture
def proxy(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy in front of moto that every S3 store opened in the test goes through."""
    with fault_proxy(moto.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        yield p


def test_every_local_blob_from_open_blob_retries_a_transient_get_with_jittered_bounded_waits(tmp_path: Path) -> None:
    waits: list[float] = []
    policy = STORAGE.with_sleep(waits.append)
    blob = open_blob(f"file://{tmp_path}/s", StoreOptions(retry=policy))
    assert isinstance(blob, RetryingBlob) and blob.policy is policy
    blob.put("a/b", b"payload")
    per_get: list[list[float]] = []
    for _ in range(20):
        blob.inner = Flaky(blob.inner, StorageError("GET a/b: 503 SlowDown"), get=2)
        before = len(waits)
        got = blob.get("a/b")
        assert got is not None and got.data == b"payload"
        per_get.append(waits[before:])
        blob.inner = blob.inner.inner  # type: ignore[attr-defined]
    assert all(len(w) == 2 for w in per_get), "two failures, two waits, then the answer"
    assert all(0 <= w[i] <= bound(policy, i) for w in per_get for i in range(2))
    assert len({round(w, 9) for w in waits}) > 30, "full jitter: the waits differ"
    # every try is counted, the failed ones too: 20 x 3 GETs of the folder "a", one PUT
    assert blob.requests == 61 and blob.requests_by_kind == {("get", "a"): 60, ("put", "a"): 1}


def test_every_s3_blob_from_open_blob_retries_a_transient_get(proxy: FaultProxy) -> None:
    waits: list[float] = []
    policy = STORAGE.with_sleep(waits.append)
    url = f"s3://{BUCKET}/retry-{uuid.uuid4().hex[:8]}"
    blob = open_blob(url, StoreOptions(retry=policy))
    assert isinstance(blob.inner, S3Blob)
    blob.put("obj", b"x")
    proxy.add("status_before_forward", method="GET", key=r"/obj$", status=503, times=2)
    got = blob.get("obj")
    assert got is not None and got.data == b"x"
    assert proxy.count("GET", r"/obj$") == 3
    assert len(waits) == 2 and all(0 <= w <= bound(policy, i) for i, w in enumerate(waits))
    assert blob.requests_by_kind[("get", "")] == 3


def test_the_store_of_a_shard_handle_is_wrapped_once(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    outer = open_blob(url)
    again = RetryingBlob(outer, policy=STORAGE.with_sleep(lambda _s: None))
    assert again.inner is outer.inner and again.counter is outer.counter, "no retry of a retry; one count"
    shard = Shard.create(url, pa.schema([("k", pa.string())]))
    assert isinstance(shard._machine.blob, RetryingBlob) and not isinstance(shard._machine.blob.inner, RetryingBlob)
    assert key_class(VERSION_0) == "state/v" and key_class("state/LATEST.json") == "state"
    assert shard.request_counter().by_kind[("create", "state/v")] == 1


def test_a_conditional_create_with_an_unknown_outcome_is_not_retried_blindly(tmp_path: Path) -> None:
    waits: list[float] = []
    blob = open_blob(f"file://{tmp_path}/s", StoreOptions(retry=STORAGE.with_sleep(waits.append)))
    local = blob.inner
    blob.inner = Flaky(local, UnknownOutcomeError("PUT If-None-Match: timeout"), create=1)
    with pytest.raises(UnknownOutcomeError):
        blob.create("state/v/x.json", b"1")
    assert waits == [] and blob.requests_by_kind[("create", "state/v")] == 1, "one try, up to the commit machine"
    # definitely not applied (never sent): retried
    blob.inner = Flaky(local, StorageError("PUT If-None-Match: connection refused"), create=1)
    blob.create("state/v/x.json", b"1")
    assert len(waits) == 1 and blob.requests_by_kind[("create", "state/v")] == 3


def test_an_s3_create_whose_answer_is_lost_is_sent_once(proxy: FaultProxy) -> None:
    waits: list[float] = []
    url = f"s3://{BUCKET}/retry-{uuid.uuid4().hex[:8]}"
    blob = open_blob(url, StoreOptions(retry=STORAGE.with_sleep(waits.append)))
    proxy.add("drop_response_after_forward", method="PUT", key=r"/state/v/x\.json$", header="If-None-Match")
    with pytest.raises(UnknownOutcomeError):
        blob.create("state/v/x.json", b"1")
    assert proxy.count("PUT", r"/state/v/x\.json$") == 1 and waits == []
    assert blob.get("state/v/x.json") is not None, "it was applied: a blind retry would have seen 412"


def _config(blob: RetryingBlob) -> Any:
    assert isinstance(blob.inner, S3Blob)
    return blob.inner.client.meta.config


def test_store_options_from_the_environment_and_explicit_reach_the_client(
        moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{BUCKET}/opts"
    monkeypatch.delenv("SHARDSINK_S3_CONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("SHARDSINK_S3_READ_TIMEOUT", raising=False)
    c = _config(open_blob(url))
    assert (c.connect_timeout, c.read_timeout, c.max_pool_connections) == (5.0, 30.0, 32)
    assert c.retries["total_max_attempts"] == 1, "botocore never retries (see storage/s3.py)"
    monkeypatch.setenv("SHARDSINK_S3_CONNECT_TIMEOUT", "2.5")
    monkeypatch.setenv("SHARDSINK_S3_READ_TIMEOUT", "7")
    assert StoreOptions.from_env() == StoreOptions(connect_timeout=2.5, read_timeout=7.0)
    c = _config(open_blob(url))
    assert (c.connect_timeout, c.read_timeout) == (2.5, 7.0)
    explicit = StoreOptions(connect_timeout=1.0, read_timeout=3.0, max_pool=4)
    c = _config(open_blob(url, explicit))
    assert (c.connect_timeout, c.read_timeout, c.max_pool_connections) == (1.0, 3.0, 4)
    c = make_client(options=explicit).meta.config
    assert (c.connect_timeout, c.read_timeout, c.max_pool_connections) == (1.0, 3.0, 4)
    import boto3

    with using_s3_access(S3Access(boto3.session.Session(), None, StoreOptions(read_timeout=11.0))):
        c = _config(open_blob(url))
    assert (c.connect_timeout, c.read_timeout) == (5.0, 11.0), "an access's options replace the environment's"
    monkeypatch.setenv("SHARDSINK_S3_READ_TIMEOUT", "soon")
    with pytest.raises(InvalidUsageError, match="SHARDSINK_S3_READ_TIMEOUT"):
        open_blob(url)


@pytest.mark.parametrize("bad", [{"connect_timeout": 0}, {"read_timeout": float("inf")}, {"max_pool": 0},
                                 {"read_timeout": "30"}])
def test_store_options_refuse_values_no_client_could_use(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsageError, match=next(iter(bad))):
        StoreOptions(**bad)


def test_a_shard_handle_keeps_the_retry_policy_of_its_store_options(tmp_path: Path) -> None:
    mine = RetryPolicy("mine", attempts=2, first_wait=0.01, max_wait=0.01, deadline=1.0)
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, pa.schema([("k", pa.string())]), blob=open_blob(url, StoreOptions(retry=mine)))
    assert isinstance(shard._machine.blob, RetryingBlob) and shard._machine.blob.policy is mine
    assert RetryingBlob(shard._machine.blob, policy=STORAGE).policy is STORAGE, "an explicit policy still wins"


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_timeout_in_the_environment_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(InvalidUsageError, match="SHARDSINK_S3_READ_TIMEOUT"):
        StoreOptions.from_env({"SHARDSINK_S3_READ_TIMEOUT": value})
