"""An ingest DAG run against a store that ignores conditional writes fails with
:class:`~shardsink.errors.UnsafeStoreError` (naming the endpoint and the header), without
Airflow retries and without writing anything under the shard; the same run against moto
directly commits (the conditional-write probe, :mod:`shardsink.storage.probe`).
Real ``airflow dags test``; the ignoring store is :mod:`support.ignoring_proxy` over moto."""

from __future__ import annotations

from af_helpers import DAY, START, Env, assert_exactly_once, ok
from support.ignoring_proxy import IgnoringProxy

from shardsink import Shard
from shardsink.storage.probe import PROBE_KEY
from shardsink.storage.s3 import make_client
from shardsink_dev.synthetic import generate
from shardsink_dev.testing import MotoServer

BUCKET = "e2e-unsafe-store"


def test_ingest_run_through_an_ignoring_store_fails_at_once_writing_nothing_and_commits_on_moto(
        af: Env, moto: MotoServer, connect_engine: dict[str, str]) -> None:
    """The landing zone is a local folder (only the shard is on S3). The run fails in ``mint``,
    whose create of the missing shard is the first write: no spark-submit starts. (``mint``
    raises the error as is, so Airflow's task retries apply; each fails the same way, before
    any shard write.)"""
    moto.make_bucket(BUCKET)
    af.env.update(moto.env())
    af.env.update({"SHARDSINK_SHARD": f"s3://{BUCKET}/shards/events", "SHARDSINK_WRITERS": "1"})
    generate(af.landing, start=START, days=1, files_per_day=1, rows_per_file=20)
    with IgnoringProxy(moto.endpoint) as proxy:
        r = af.dags_test("2024-01-02", extra={"AWS_ENDPOINT_URL": proxy.url})
        out = r.stdout + r.stderr
        assert r.returncode != 0, out[-4000:]
        assert {q.key.split("/", 1)[0] for q in proxy.requests("PUT")} == {"_shardsink"}, "a shard write was sent"
    assert f"UnsafeStoreError: the S3 store at {proxy.url} ignores the If-None-Match header" in out, out[-4000:]
    assert "Spark-Submit cmd" not in out
    keys = [o["Key"] for o in make_client(moto.endpoint).list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == [PROBE_KEY], "something was written beside the probe object"

    ok(af.dags_test("2024-01-02", extra=connect_engine))  # the same run against moto directly (writes over Connect)
    assert Shard.open(af.shard_url).info().upper == START + DAY
    assert_exactly_once(af.shard_url, af.landing, START, START + DAY)
