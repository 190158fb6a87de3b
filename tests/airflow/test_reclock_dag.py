"""Reclocked ingestion through real Airflow (`airflow dags test`) and real spark-submit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from af_helpers import DAY, START, VENV_BIN, Env, assert_no_leaks, ok

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reclock"))
from rc_helpers import assert_exactly_once, land, times_of

COLUMNS = {"id": "int64", "route": "string", "v": "string"}


def arrivals_env(af: Env) -> dict[str, str]:
    af.env.update({"SHARDSINK_DAG_ID": "example_arrivals", "SHARDSINK_ARRIVALS": str(af.root / "arrivals"),
                   "SHARDSINK_SHARD": (af.root / "shards" / "arrivals").as_uri(), "SHARDSINK_SETTLE_S": "0",
                   "SHARDSINK_COLUMNS": json.dumps(COLUMNS)})
    return af.env


def test_arrivals_dag_ingests_each_file_once_and_a_fresh_metadata_db_replays_nothing(
        af: Env, airflow_template: Path, tmp_path: Path) -> None:
    env = arrivals_env(af)
    arrivals = env["SHARDSINK_ARRIVALS"]
    ids = land(arrivals, "x/1.parquet", range(0, 40)) + land(arrivals, "x/2.jsonl", range(40, 60))
    ok(af.dags_test("2024-01-02"))
    ids += land(arrivals, "y/3.csv", range(60, 75))
    ok(af.dags_test("2024-01-03"))
    assert_exactly_once(af.shard_url, ids)
    assert_no_leaks(af.shard_url)
    t = times_of(af.shard_url)
    assert {t[i] for i in range(60)} == {START + DAY - 1} and {t[i] for i in range(60, 75)} == {START + 2 * DAY - 1}

    # A wiped Airflow metadata DB: the shards alone say where to resume; re-runs change nothing.
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    (fresh / "airflow.db").write_bytes(airflow_template.read_bytes())
    out = ok(af.dags_test("2024-01-03", home=fresh))
    assert "nothing to do" in out and "Spark-Submit cmd" not in out
    ids += land(arrivals, "z/4.parquet", range(75, 90))
    ok(af.dags_test("2024-01-04", home=fresh))
    assert_exactly_once(af.shard_url, ids)

    # The operator's view: inspect names the remap shard and the source frontier; remap lists bindings.
    cli = str(VENV_BIN / "shardsink")
    r = subprocess.run([cli, "inspect", af.shard_url, "--json"], capture_output=True, text=True, env=env, timeout=60)
    ok(r)
    d = json.loads(r.stdout)
    assert d["reclock"]["remap"].endswith("arrivals-remap") and d["reclock"]["source_frontier"] == {"files": 4}
    assert d["reclock"]["resume_frontier"] == {"files": 4} and d["reclock"]["health"]["status"] == "running"
    r = subprocess.run([cli, "remap", d["reclock"]["remap"], "--json"], capture_output=True, text=True, env=env,
                       timeout=60)
    ok(r)
    b = json.loads(r.stdout)
    assert [x["frontier"] for x in b["bindings"]] == [{"files": 2}, {"files": 3}, {"files": 4}]
    assert [f["key"] for f in b["bindings"][2]["files"]] == ["z/4.parquet"]
