"""Reclocked ingestion through real Airflow (`airflow dags test`): the arrivals DAG's write slots
are sessions of the test process's Spark Connect server (nothing there is about where Spark runs:
binding, exactly-once and resumption are decided outside the write job), the Kafka DAG's a real
spark-submit (its executors read the bound offsets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from af_helpers import DAY, START, VENV_BIN, Env, assert_no_leaks, ok

from shardsink_dev.dagrunner import dags_test as warm_dags_test

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reclock"))
from rc_helpers import assert_exactly_once, create_topic, land, produce, tansu_broker, times_of

COLUMNS = {"id": "int64", "route": "string", "v": "string"}


def dags_test(af: Env, day: str, *, home: Path | None = None, dag: str = "example_arrivals") -> str:
    env = dict(af.env)
    if home is not None:
        env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"})
    return ok(warm_dags_test(env, dag, day, timeout=1200))


def test_arrivals_dag_ingests_each_file_once_and_a_fresh_metadata_db_loses_nothing(
        af: Env, airflow_template: Path, tmp_path: Path, connect_engine: dict[str, str]) -> None:
    af.env.update(connect_engine)  # SHARDSINK_ENGINE=connect: the example's write slots over Connect
    af.env.update({"SHARDSINK_ARRIVALS": str(af.root / "arrivals"), "SHARDSINK_WRITERS": "1",
                   "SHARDSINK_ARRIVALS_SHARD": (af.root / "shards" / "arrivals").as_uri(),
                   "SHARDSINK_ARRIVALS_SETTLE_S": "0", "SHARDSINK_ARRIVALS_COLUMNS": json.dumps(COLUMNS)})
    arrivals, shard_url = af.env["SHARDSINK_ARRIVALS"], af.env["SHARDSINK_ARRIVALS_SHARD"]
    ids = land(arrivals, "x/1.parquet", range(0, 40)) + land(arrivals, "x/2.jsonl", range(40, 60))
    out = dags_test(af, "2024-01-02")  # covers [Jan 1, Jan 2): binds both files at Jan 2 - 1 ms
    assert "over Spark Connect" in out and "Spark-Submit cmd" not in out

    # The Airflow metadata DB is wiped: the shards alone say where to resume.
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    (fresh / "airflow.db").write_bytes(airflow_template.read_bytes())
    out = dags_test(af, "2024-01-02", home=fresh)
    assert "nothing to do" in out and "Spark-Submit cmd" not in out and "writing slot" not in out
    ids += land(arrivals, "y/3.csv", range(60, 75))
    assert "over Spark Connect" in dags_test(af, "2024-01-03", home=fresh)
    assert_exactly_once(shard_url, ids)
    assert_no_leaks(shard_url)
    t = times_of(shard_url)
    assert {t[i] for i in range(60)} == {START + DAY - 1} and {t[i] for i in range(60, 75)} == {START + 2 * DAY - 1}

    # The operator's view: inspect names the remap shard and the source frontier; remap lists bindings.
    cli = str(VENV_BIN / "shardsink")
    r = subprocess.run([cli, "inspect", shard_url, "--json"], capture_output=True, text=True, env=af.env,
                       timeout=120)
    ok(r)
    rc = json.loads(r.stdout)["reclock"]
    assert rc["remap"].endswith("arrivals-remap") and rc["source_frontier"] == {"files": 3}
    assert rc["resume_frontier"] == {"files": 3} and rc["health"]["status"] == "running"
    r = subprocess.run([cli, "remap", rc["remap"], "--json"], capture_output=True, text=True, env=af.env, timeout=120)
    ok(r)
    b = json.loads(r.stdout)
    assert [x["frontier"] for x in b["bindings"]] == [{"files": 2}, {"files": 3}]
    assert [f["key"] for f in b["bindings"][1]["files"]] == ["y/3.csv"]


def test_kafka_dag_reads_bound_offsets_on_executors_and_commits_group_offsets(af: Env) -> None:
    from shardsink.sources.kafka import KafkaSource

    with tansu_broker() as bootstrap:
        topic = create_topic(bootstrap, 2)
        shard = (af.root / "shards" / "kafka").as_uri()
        af.env.update({"SHARDSINK_KAFKA_BOOTSTRAP": bootstrap, "SHARDSINK_KAFKA_TOPIC": topic,
                       "SHARDSINK_KAFKA_SHARD": shard, "SHARDSINK_KAFKA_COLUMNS": json.dumps(COLUMNS)})
        ids = produce(bootstrap, topic, range(0, 60), partitions=2)
        dags_test(af, "2024-01-02", dag="example_kafka")
        assert_exactly_once(shard, ids)
        assert_no_leaks(shard)
        src = KafkaSource(bootstrap, topic, remap=shard + "-remap", group_id=f"shardsink-{topic}")
        assert src.committed_offsets() == {0: 30, 1: 30}, "the group's offsets are the resumption frontier"
