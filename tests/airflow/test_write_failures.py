"""Typed failures across the spark-submit boundary, end to end: real `airflow dags test`,
real spark-submit, the job's outcome record read back by the write operator.

* invalid input (a late file) fails the write at once, without burning its Airflow
  retries, naming the file and the offending value;
* a storage error (a 503 on a landing file, injected between boto3 and moto) is retried
  by Airflow, and the retry commits the batch exactly once;
* corruption (a view input's part is missing) fails at once, loudly.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from af_helpers import DAY, START, Env, assert_exactly_once, assert_no_leaks, ok
from support.faultproxy import fault_proxy

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.errors import ShardNotFoundError
from shardsink.maintenance import set_retention
from shardsink.sources.landing import slot_of
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
    naming it, nothing of it committed (never its day-2 rows without its day-1 rows).

    Two writer slots, a late file in each one's share: whichever slot runs first fails for good and
    records it (:mod:`shardsink.sinks.cancel`); the other, run after it (``dags test`` runs them in
    turn), is cancelled without starting a JVM (issue 35). One spark-submit in all."""
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
    lates = {slot_of(k, 2): k for k in (f"day=000/late-{i}.csv" for i in range(20))}  # one in each slot's share
    assert sorted(lates) == [0, 1]
    for key in lates.values():
        land_file(af.landing, key, late)
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
    assert out.count(SUBMIT) == 1, "the write was retried, or its sibling slot started a JVM"
    assert out.count("write job failed: InvalidUsageError (LateDataError)") == 1
    assert "invalid input, not retried: InvalidUsageError: LateDataError: late file" in out
    failed = next(slot for slot, key in lates.items() if f"{af.landing}/{key}" in out)
    assert f"[value: {tmin}]" in out
    assert "commit seqno 1 " in out  # the append that sealed its earliest time, not maintenance
    assert out.count(f"cancelled, not retried: slot {failed} of description ") == 1, "the sibling was not cancelled"
    assert f"this attempt cannot commit; slot {1 - failed} stops its Spark application" in out
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
        # nth=2: the mint's one read of the new file (it indexes it) goes through; every try of
        # the write job's read gets the 503.
        rule = proxy.add("status_before_forward", method="GET", key=r"landing/day=000/events-1\.csv$", status=503,
                         code="SlowDown", nth=2, times=STORAGE.attempts)
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
    src._machine.blob.delete(lost)

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


BLOCKING_APP = """
import os, sys, time
from pyspark.sql import SparkSession

started = os.environ["BLOCKING_APP_STARTED"]


def hold(rows):
    with open(started + ".worker.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(started + ".worker.tmp", started + ".worker")
    time.sleep(3600)  # the workload: a write that does not end by itself
    yield from rows


spark = SparkSession.builder.getOrCreate()
with open(started + ".driver.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(started + ".driver.tmp", started + ".driver")
spark.sparkContext.parallelize([0], 1).mapPartitions(hold).collect()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_exits(pids: Iterable[int], *, timeout: float) -> None:
    """Block until every process in ``pids`` has exited or ``timeout`` passed: woken by the exits
    themselves (pidfds), not polling. One already gone counts as exited."""
    fds = []
    for pid in pids:
        with suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        deadline = time.monotonic() + timeout
        while fds and (left := deadline - time.monotonic()) > 0:
            exited, _, _ = select.select(fds, [], [], left)
            for fd in exited:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_slot_failing_for_good_kills_its_running_siblings_spark_application(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the write slots are separate Airflow tasks, so a failed slot cannot stop its siblings
    in-process; it records its final failure in the shard's store and every running slot polls for
    it. Here the real write operator runs a real spark-submit (local[1]) whose executor task never
    ends; once a sibling records its failure, the operator kills the application: its task fails
    without retries naming the sibling's failure, and its JVM, Python driver and Python worker are
    gone (not left running, as before)."""
    import threading

    from airflow.sdk.exceptions import AirflowFailException

    from shardsink.airflow.reprocess import IngestWriteOperator
    from shardsink.sinks.cancel import SlotCancels
    from shardsink.sinks.description import Description, to_builtins
    from shardsink.sources import LandingSource
    from shardsink_dev import jvm

    url = Shard.create((tmp_path / "shard").as_uri(), SCHEMA, upper=START).url
    app, started = tmp_path / "blocking_app.py", tmp_path / "started"
    app.write_text(BLOCKING_APP)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL1", '{"conn_type": "spark", "host": "local[1]"}')
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    desc = Description(desc_id="cancel-e2e-a1-00000001", lower=START, upper=START + DAY, attempt=1)
    op = IngestWriteOperator(task_id="write", shard_url=url, source_spec=LandingSource(str(tmp_path)).spec(), slots=2,
                             slot=0, desc=to_builtins(desc), application=str(app), conn_id="spark_local1",
                             conf={"spark.ui.enabled": "false"}, cancel_poll=0.2,
                             env_vars={"BLOCKING_APP_STARTED": str(started), "SPARK_SUBMIT_OPTS": jvm.submit_opts(),
                                       "SPARK_LAUNCHER_OPTS": jvm.launcher_opts()})
    context = {"dag_run": SimpleNamespace(clear_number=0, run_id="r"), "ti": SimpleNamespace(try_number=1, max_tries=2)}
    raised: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(context)
        except BaseException as e:
            raised.append(e)

    slot0 = threading.Thread(target=run)
    slot0.start()
    deadline = time.monotonic() + 300
    while not (Path(f"{started}.driver").exists() and Path(f"{started}.worker").exists()):
        assert slot0.is_alive() and time.monotonic() < deadline, f"the application never started: {raised}"
        time.sleep(0.1)  # a file handshake with the Spark application (no pipe to it): polled, bounded
    pids = {"jvm": op._hook._submit_sp.pid, "driver": int(Path(f"{started}.driver").read_text()),
            "worker": int(Path(f"{started}.worker").read_text())}
    assert all(_alive(p) for p in pids.values())

    SlotCancels(url, desc.desc_id, generation=0).record(1, "InvalidUsageError: LateDataError: late file x")  # slot 1
    slot0.join(timeout=120)
    assert not slot0.is_alive(), "the running slot was not cancelled"
    assert len(raised) == 1 and isinstance(raised[0], AirflowFailException), raised
    assert str(raised[0]).startswith(f"cancelled, not retried: slot 1 of description {desc.desc_id} failed for good")
    assert str(raised[0]).endswith("Slot 1: InvalidUsageError: LateDataError: late file x")
    _wait_exits(pids.values(), timeout=60)
    assert not [name for name, p in pids.items() if _alive(p)], f"left running: {pids}"
    assert SlotCancels(url, desc.desc_id, generation=0).failure().slot == 1  # the cause stays the sibling's
