"""Typed failures across the spark-submit boundary, end to end: real `airflow dags test`,
real spark-submit, the job's outcome record read back by the write operator.

* invalid input (a late file) fails the write at once, without burning its Airflow
  retries, naming the file and the offending value;
* a storage error (a 503 on a landing file, injected between boto3 and moto) is retried
  by Airflow, and the retry commits the batch exactly once;
* corruption (a view input's part is missing) fails at once, loudly.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
from af_helpers import DAY, START, Env, assert_exactly_once, assert_no_leaks, ok
from support.faultproxy import fault_proxy

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.errors import ShardNotFoundError
from shardsink.maintenance import set_retention
from shardsink.storage.retry import STORAGE
from shardsink_dev.dagrunner import dags_test
from shardsink_dev.synthetic import SCHEMA, generate, land_file, landing_table, publish_watermark
from shardsink_dev.testing import MotoServer

SUBMIT = "Spark-Submit cmd"


def _failed(r: object) -> str:
    out = r.stdout + r.stderr  # type: ignore[attr-defined]
    assert r.returncode != 0, out[-4000:]  # type: ignore[attr-defined]
    return str(out)


def test_late_file_fails_the_write_at_once_naming_the_file_and_value(af: Env) -> None:
    """Day 1 is sealed by two plain appends (lateness is judged from the commit log's seals, whoever
    committed them; a first ``dags test`` would only add an Airflow process and a JVM). The late
    file lands, then maintenance commits on top of the seals: a retention change, the example
    maintenance DAG's pass (since advance, compaction of the two appends), and two schema changes
    (add then drop a column). None of them seals times, so the file stays late: refused whole,
    naming it, nothing of it committed (never its day-2 rows without its day-1 rows). One writer
    slot: the failure is the job's, not a slot's."""
    af.env["SHARDSINK_WRITERS"] = "1"
    generate(af.landing, start=START, days=1, files_per_day=1, rows_per_file=50, watermark=START + DAY)
    shard = Shard.create(af.shard_url, SCHEMA, upper=START)
    def one(t: int) -> pa.Table:
        return pa.table({"user": ["u"], "action": ["a"], "amount": pa.array([1], pa.int64()), "_time": [t]})

    shard.append(one(START), lower=START, upper=START + DAY // 2)  # seals day 1, in two batches
    shard.append(one(START + DAY // 2), lower=START + DAY // 2, upper=START + DAY)
    time.sleep(0.01)  # the late file lands strictly after the seal (millisecond commit times)
    late = landing_table(START, START + 2 * DAY, 10, seed=99)  # lands after day 1 was sealed
    tmin = pc.min(late["event_time"]).as_py()
    assert tmin < START + DAY and pc.max(late["event_time"]).as_py() >= START + DAY
    land_file(af.landing, "day=000/late-0.csv", late)
    land_file(af.landing, "day=001/events-0.csv", landing_table(START + DAY, START + 2 * DAY, 20, seed=5))
    publish_watermark(af.landing, START + 2 * DAY)
    set_retention(shard, "1h")
    ok(dags_test({**af.env, "SHARDSINK_MAINTENANCE_SHARDS": af.shard_url, "SHARDSINK_GC_GRACE_S": "0"},
                 "example_maintenance", "2024-01-02"))
    shard.evolve(SchemaChange(kind="add", name="extra", type="int64"))
    shard.evolve(SchemaChange(kind="drop", name="extra"))
    kinds = [c.kind for _, c in reversed(shard.log(limit=20))]
    assert kinds == ["create", "append", "append", "retention", "since", "compact", "schema", "schema"], kinds
    before = shard.info()

    out = _failed(af.dags_test("2024-01-03"))  # task_retries is 2: an invalid input must not use them
    assert out.count(SUBMIT) == 1, "the write was retried (or never ran)"
    assert out.count("write job failed: InvalidUsageError (LateDataError)") == 1
    assert "invalid input, not retried: InvalidUsageError: LateDataError: late file" in out
    assert f"{af.landing}/day=000/late-0.csv" in out and f"[value: {tmin}]" in out
    assert "commit seqno 1 " in out  # the append that sealed its earliest time, not maintenance
    info = Shard.open(af.shard_url).info()
    assert (info.seqno, info.upper, info.stats) == (before.seqno, START + DAY, before.stats)


def test_storage_error_in_the_write_job_is_retried_and_commits_once(af: Env, moto: MotoServer) -> None:
    bucket = "e2e-storage-error"
    moto.make_bucket(bucket)
    af.env.update(moto.env())
    af.env.update({"SHARDSINK_LANDING": f"s3://{bucket}/landing", "SHARDSINK_SHARD": f"s3://{bucket}/shards/events",
                   "SHARDSINK_WRITERS": "1"})
    generate(af.landing, start=START, days=1, files_per_day=2, rows_per_file=50)
    Shard.create(af.shard_url, SCHEMA, upper=START)  # mint then reads no landing file
    with fault_proxy(moto.endpoint) as proxy:
        # Every try of the store's retry policy of one landing GET (by a Spark executor) gets a
        # 503: a single transient 503 is absorbed inside the job (tests/storage/test_retry.py),
        # this many fail it with a StorageError, which the Airflow task retries.
        rule = proxy.add("status_before_forward", method="GET", key=r"landing/day=000/events-1\.csv$", status=503,
                         code="SlowDown", times=STORAGE.attempts)
        af.env["AWS_ENDPOINT_URL"] = proxy.url
        out = ok(af.dags_test("2024-01-02"))
    assert rule.fired == STORAGE.attempts
    assert out.count("write job failed: StorageError (StorageError)") == 1
    assert out.count(SUBMIT) == 2, "the storage error was not retried exactly once"
    info = Shard.open(af.shard_url).info()
    assert (info.seqno, info.upper) == (1, START + DAY)
    assert_exactly_once(af.shard_url, af.landing, START, START + DAY)
    assert_no_leaks(af.shard_url)


def test_missing_input_part_fails_the_view_write_at_once_as_corruption(af: Env) -> None:
    af.env["SHARDSINK_VIEW"] = (af.root / "shards" / "per_user_day").as_uri()
    src = Shard.create(af.shard_url, SCHEMA, upper=START)
    src.append(pa.table({"user": ["a", "b"], "action": ["buy", "view"], "amount": [1, 2],
                         "_time": [START + 5, START + 6], "_diff": [1, 1]}), lower=START, upper=START + DAY)
    lost = src.batches()[0].parts[0].key
    src.blob.delete(lost)

    r = dags_test(af.env, "example_view", "2024-02-01")
    out = _failed(r)
    assert out.count(SUBMIT) == 1, "the corrupt read was retried"
    assert "CORRUPTION, not retried (stop and page a human): CorruptionError:" in out
    assert lost in out and "is missing" in out
    try:
        view = Shard.open(af.env["SHARDSINK_VIEW"])
    except ShardNotFoundError:
        return  # the first write creates the output: nothing was created
    assert view.info().seqno == 0
