"""The conditional-write probe (:mod:`shardsink.storage.probe`): a store that ignores
``If-None-Match`` or ``If-Match`` is refused for writing, naming the endpoint and the header,
before anything is written under the shard; reads still work; a store that honours both
(moto) costs at most 3 probe requests per process and endpoint; the opt-out is explicit and loud.

The ignoring store is real HTTP: a reverse proxy in front of the moto server that drops the
conditional headers before forwarding (:mod:`support.ignoring_proxy`). A DAG run through it:
tests/airflow/test_unsafe_store.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.faultproxy import FaultProxy
from support.ignoring_proxy import IgnoringProxy

from shardsink import Shard
from shardsink.errors import InvalidUsageError, UnsafeStoreError
from shardsink.storage import open_blob, parse_url
from shardsink.storage import probe as pr
from shardsink.storage.options import TRUST_ENV, StoreOptions
from shardsink.storage.s3 import make_client
from shardsink_dev.testing import MotoServer

BUCKET = "shardsink-test"  # created by the session `moto` fixture in tests/conftest.py
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
BATCH = pa.table({"k": ["a", "b"], "v": [1, 2], "_time": [1, 2]})
_SCRIPT = Path(sys.executable).with_name("shardsink")
SHARDSINK = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "shardsink"]


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test probes as a fresh process would; none trusts the store unless it says so."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    pr.forget()
    yield
    pr.forget()


@pytest.fixture
def ignoring(moto: MotoServer) -> Iterator[IgnoringProxy]:
    proxy = IgnoringProxy(moto.endpoint)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def fresh_url() -> str:
    return f"s3://{BUCKET}/probe-{uuid.uuid4().hex[:12]}"


def under(url: str) -> list[str]:
    """Every object under the shard's root, listed on moto directly."""
    u = parse_url(url)
    r = make_client(os.environ["AWS_ENDPOINT_URL"]).list_objects_v2(Bucket=u.bucket, Prefix=f"{u.path}/")
    return [o["Key"] for o in r.get("Contents", [])]


def probe_puts(proxy: FaultProxy) -> int:
    return proxy.count("PUT", pr.PROBE_KEY)


# --- the library ------------------------------------------------------------------------------


def test_create_and_append_through_an_ignoring_store_fail_naming_endpoint_and_header_and_write_nothing(
        ignoring: IgnoringProxy, moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    created, fresh = fresh_url(), fresh_url()
    Shard.create(created, SCHEMA)  # on moto directly: the same calls succeed there
    Shard.open(created).append(BATCH, lower=0, upper=5)
    before = under(created)
    monkeypatch.setenv("AWS_ENDPOINT_URL", ignoring.url)

    with pytest.raises(UnsafeStoreError) as e:
        Shard.create(fresh, SCHEMA)
    assert ignoring.url in str(e.value) and "ignores the If-None-Match header" in str(e.value)
    assert e.value.retryable is False and e.value.value == ignoring.url
    shard = Shard.open(created)  # reads still work through the ignoring store
    assert shard.info().upper == 5
    with pytest.raises(UnsafeStoreError, match="If-None-Match"):
        shard.append(BATCH.set_column(2, "_time", pa.array([6, 7])), lower=5, upper=10)

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    assert under(fresh) == [], "something was written under the refused shard"
    assert under(created) == before, "the refused append wrote under the shard"
    assert Shard.open(created).info().seqno == 1
    puts = ignoring.requests("PUT")
    assert {p.key.split("/", 1)[0] for p in puts} == {"_shardsink"}, "a write other than the probe's was sent"
    assert len(puts) == 2, "the verdict was not cached: the append probed again"


def test_a_store_that_ignores_only_if_match_is_refused_naming_if_match(moto: MotoServer) -> None:
    with IgnoringProxy(moto.endpoint, ignored=("if-match",)) as proxy:
        blob = open_blob(fresh_url(), StoreOptions())
        blob.inner.client = make_client(proxy.url)  # type: ignore[attr-defined]
        with pytest.raises(UnsafeStoreError) as e:
            blob.put("parts/x/y.parquet", b"data")
    assert proxy.url in str(e.value) and "ignores the If-Match header" in str(e.value)
    assert [r.headers.get("if-match") for r in proxy.requests("PUT")][-1] == pr.STALE_ETAG


def test_a_store_that_answers_501_to_the_header_is_refused_and_the_verdict_cached(moto: MotoServer) -> None:
    with FaultProxy(moto.endpoint) as proxy:
        proxy.add("status_before_forward", method="PUT", key=pr.PROBE_KEY, header="If-None-Match", status=501,
                  code="NotImplemented", times=None)
        for _ in range(2):
            blob = open_blob(fresh_url())
            blob.inner.client = make_client(proxy.url)  # type: ignore[attr-defined]
            with pytest.raises(UnsafeStoreError, match="does not support the If-None-Match header "
                                                       r"\(501 NotImplemented\)"):
                blob.create("state/v/x.json", b"{}")
        assert probe_puts(proxy) == 1 and proxy.count("PUT") == 1


def test_an_honest_store_costs_at_most_3_probe_requests_per_process_and_endpoint(moto: MotoServer) -> None:
    with FaultProxy(moto.endpoint) as counting:  # forwards everything: moto honours both headers
        for i in range(3):  # three stores opened in one "process": the first probes, the others reuse it
            blob = open_blob(fresh_url())
            blob.inner.client = make_client(counting.url)  # type: ignore[attr-defined]
            blob.put("parts/d/p.parquet", b"x")
            assert 2 <= probe_puts(counting) <= 3, f"store {i}"
        first = probe_puts(counting)
        verdict = pr.verdict(counting.url)
        assert verdict is not None and verdict.ignored is None and verdict.requests == first
        pr.forget()  # a second process: the probe object exists, its first create is refused (2 requests)
        blob.put("parts/d/q.parquet", b"y")
        assert probe_puts(counting) - first == 2
        assert [r.client_status for r in counting.requests("PUT", pr.PROBE_KEY)][-2:] == [412, 412]


def test_the_store_counter_leaves_out_the_probe_requests(moto: MotoServer) -> None:
    blob = open_blob(fresh_url())
    blob.put("parts/d/p.parquet", b"x")
    assert (blob.requests, blob.inner.requests) == (1, 1)  # type: ignore[attr-defined]
    assert pr.verdict(os.environ["AWS_ENDPOINT_URL"]) is not None


def test_the_opt_out_skips_the_probe_and_says_so_loudly(
        ignoring: IgnoringProxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", ignoring.url)
    monkeypatch.setenv(TRUST_ENV, "1")
    url = fresh_url()
    with caplog.at_level(logging.WARNING, logger="shardsink.storage.s3"):
        Shard.create(url, SCHEMA).append(BATCH, lower=0, upper=5)  # the operator's risk: nothing checks
    assert probe_puts(ignoring) == 0
    assert "CONDITIONAL-WRITE PROBE SKIPPED" in caplog.text and TRUST_ENV in caplog.text and url in caplog.text
    assert StoreOptions(trust_conditional_writes=True).trust_conditional_writes


@pytest.mark.parametrize("text", ["maybe", "2", "trust"])
def test_a_bad_opt_out_value_is_refused_naming_it(text: str) -> None:
    with pytest.raises(InvalidUsageError, match=f"{TRUST_ENV}='{text}'"):
        StoreOptions.from_env({TRUST_ENV: text})
    with pytest.raises(InvalidUsageError, match="trust_conditional_writes"):
        StoreOptions(trust_conditional_writes=text)  # type: ignore[arg-type]
    assert StoreOptions.from_env({TRUST_ENV: "0"}).trust_conditional_writes is False
    assert StoreOptions.from_env({}).trust_conditional_writes is False


@pytest.mark.parametrize("url", ["s3://b-x/_shardsink", "s3://b-x/_shardsink/probe", "s3://b-x/_shardsink/a/b"])
def test_no_shard_can_contain_the_probe_object(url: str) -> None:
    """So GC and verify, which list only under a shard's root, never see, delete or flag it."""
    with pytest.raises(InvalidUsageError, match="reserved"):
        parse_url(url)
    assert parse_url("s3://b-x/shards/_shardsink").path == "shards/_shardsink"  # only at the bucket's root


# --- the command line -------------------------------------------------------------------------


def run_cli(*args: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    env.pop(TRUST_ENV, None)
    return subprocess.run([*SHARDSINK, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_create_and_append_fail_through_an_ignoring_store_and_succeed_on_moto(
        ignoring: IgnoringProxy, moto: MotoServer, tmp_path: Path) -> None:
    schema, batch = tmp_path / "schema.csv", tmp_path / "batch.csv"
    schema.write_text("k,v,_time\nx,1,0\n")
    batch.write_text("k,v,_time\na,1,0\nb,2,3\n")
    url, refused = fresh_url(), fresh_url()
    create = ("create", "--schema-from", str(schema))
    append = ("append", "--lower", "0", "--upper", "5", "--input", str(batch))

    bad_create = run_cli(create[0], refused, *create[1:], endpoint=ignoring.url)
    assert run_cli(create[0], url, *create[1:], endpoint=moto.endpoint).returncode == 0
    created = under(url)
    bad_append = run_cli(append[0], url, *append[1:], endpoint=ignoring.url)

    for r in (bad_create, bad_append):
        assert r.returncode == 1, r.stderr
        assert "shardsink: error: the S3 store at " + ignoring.url in r.stderr
        assert "ignores the If-None-Match header" in r.stderr and "Traceback" not in r.stderr
    assert under(refused) == []
    assert under(url) == created, "the refused append wrote under the shard"
    good = run_cli(append[0], url, *append[1:], endpoint=moto.endpoint)
    assert good.returncode == 0, good.stderr
    assert Shard.open(url).info().upper == 5
