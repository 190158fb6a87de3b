"""schema_mode end to end with real Airflow (`airflow dags test`): day 2's landing files gain a
nullable column. One DAG file, one Airflow home, three runs of the same day: strict fails naming
the file and the column with nothing committed; an add_columns dry run reports the column it would
add and commits nothing; add_columns is green, the shard's schema history shows the add, and the
snapshot reads nulls for day 1 and values for day 2. The two writing runs' write slots are sessions
of the test process's Spark Connect server (``SHARDSINK_ENGINE=connect``, the ``connect_engine``
fixture): nothing here is about where Spark runs, and the write job and its checks are the same
code on both engines (tests/spark/test_connect.py, test_production_shape.py cover spark-submit).
The dry run is the DAG's with the default engine, on a local Spark session in the task."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from af_helpers import DAY, START, Env, ok
from support.fake_source import FakeSource

from shardsink import Shard
from shardsink.airflow import ingest_dag
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import Description
from shardsink.sources import LandingSource
from shardsink.sources.landing import read_landing_file
from shardsink.spark.request import IngestCorrectRequest
from shardsink_dev.dagrunner import dags_test
from shardsink_dev.synthetic import SCHEMA, land_file, landing_table, publish_watermark

DAG_FILE = textwrap.dedent("""
    import os
    from datetime import UTC, datetime, timedelta

    from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, ingest_dag
    from shardsink.sources import LandingSource

    dag = ingest_dag(
        dag_id="evolving_ingest",
        shard_url=os.environ["SHARDSINK_SHARD"],
        source=LandingSource(os.environ["SHARDSINK_LANDING"]),
        writers=1,
        start_date=datetime(2024, 1, 1, tzinfo=UTC),
        shard=ShardOptions(max_span=timedelta(days=1)),
        attempts=AttemptOptions.from_env(),
        schema_mode=os.environ["SHARDSINK_SCHEMA_MODE"],
        spark=SparkOptions(engine=os.environ.get("SHARDSINK_ENGINE", "submit")),
    )
""")


def _commit_day_1(af: Env) -> Shard:
    """Day 1 as an earlier run left it: committed under the shard's first schema (no JVM)."""
    src = LandingSource(af.landing)
    f = next(f for f in src.files() if f.key == "day1.parquet")
    shard = Shard.create(af.shard_url, SCHEMA, upper=START)
    staged = shard.stage(read_landing_file(src.blob(), f, SCHEMA, "event_time"), lower=START, upper=START + DAY,
                         desc_id="day1")
    shard.compare_and_append([staged], expected_upper=START, new_upper=START + DAY, desc_id="day1")
    return shard


def test_day_2_gains_a_column_strict_refuses_add_columns_evolves(af: Env, tmp_path: Path,
                                                                 connect_engine: dict[str, str]) -> None:
    land_file(af.landing, "day1.parquet", landing_table(START, START + DAY, 20, seed=1))
    day2 = landing_table(START + DAY, START + 2 * DAY, 12, seed=2)
    land_file(af.landing, "day2.parquet", day2.append_column("country", pa.array(["nl", "de", "fr"] * 4)))
    publish_watermark(af.landing, START + 2 * DAY)
    shard = _commit_day_1(af)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "evolving_ingest.py").write_text(DAG_FILE)
    # The connection is in every run's environment (Airflow reads AIRFLOW_* once per process:
    # one warm runner serves all three runs); SHARDSINK_ENGINE picks the engine per run.
    af.env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "SHARDSINK_DAG_ID": "evolving_ingest",
                   "SHARDSINK_MAX_ATTEMPTS": "1",
                   "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_engine["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"]})
    connect = {"SHARDSINK_ENGINE": connect_engine["SHARDSINK_ENGINE"]}

    r = af.dags_test("2024-01-03", extra={"SHARDSINK_SCHEMA_MODE": "strict", **connect})  # covers day 2
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-4000:]
    assert f"{LandingSource(af.landing).root}/day2.parquet: columns do not match the shard" in out
    assert "unexpected ['country']" in out and "invalid input, not retried" in out
    assert "over Spark Connect" in out and "Spark-Submit cmd" not in out
    assert out.count("writing slot 0 of 1 for description") == 1, "an invalid file was retried"
    info = shard.info()
    assert (info.seqno, info.upper, len(shard.schema_history())) == (1, START + DAY, 1)  # nothing committed

    # A dry run under add_columns reports the column it would add and commits nothing (not the schema).
    dry = ok(dags_test({**af.env, "SHARDSINK_SCHEMA_MODE": "add_columns"}, "evolving_ingest", "2024-01-03",
                       conf={"dry_run": True}))
    assert "dry run: computing what the run would write on a local Spark session" in dry
    assert "DRY RUN (nothing written): " in dry and '"schema_changes": ["would add column country: string"]' in dry
    assert (shard.info().seqno, len(shard.schema_history())) == (1, 1)

    out = ok(af.dags_test("2024-01-03", extra={"SHARDSINK_SCHEMA_MODE": "add_columns", **connect}))
    assert "schema_mode add_columns: evolved" in out and "add country:string" in out
    assert "over Spark Connect" in out and "Spark-Submit cmd" not in out
    info = shard.info()
    assert info.upper == START + 2 * DAY
    hist = shard.schema_history()
    assert [(e.id, [f.name for f in e.fields]) for e in hist] == [
        (0, ["user", "action", "amount"]), (1, ["user", "action", "amount", "country"])]
    assert hist[1].upper == START + DAY and hist[1].seqno == 2  # made current before day 2's batch
    assert [(c["kind"], c["seqno"]) for c in _log(shard)] == [("append", 1), ("schema", 2), ("append", 3)]
    assert [b.schema_id for b in shard.batches()] == [0, 1]
    snap = shard.snapshot(START + 2 * DAY - 1)
    assert snap.num_rows == 32 and sum(snap["_count"].to_pylist()) == 32
    d1 = shard.changes(START, START + DAY)
    d2 = shard.changes(START + DAY, START + 2 * DAY)
    assert d1.num_rows == 20 and d1["country"].null_count == 20
    assert sorted(d2["country"].to_pylist()) == sorted(["nl", "de", "fr"] * 4)


def _log(shard: Shard) -> list[dict[str, object]]:
    return [{"kind": c.kind, "seqno": s} for s, c in reversed(shard.log(limit=10)) if s > 0]


def test_schema_mode_is_checked_at_parse_time_and_reaches_the_write_request(tmp_path: Path) -> None:
    def build(mode: object, source: object = None) -> object:
        return ingest_dag(dag_id="modes", shard_url=(tmp_path / "shard").as_uri(), writers=1,
                          start_date=datetime(2024, 1, 2, tzinfo=UTC), schema_mode=mode,  # type: ignore[arg-type]
                          source=source or LandingSource(str(tmp_path / "landing")))

    with pytest.raises(InvalidUsageError, match="schema_mode must be 'strict' or 'add_columns', got 'merge'"):
        build("merge")
    with pytest.raises(InvalidUsageError, match="source 'fake' cannot"):
        build("add_columns", FakeSource(0))
    d = Description(desc_id="d-1", lower=0, upper=10, attempt=1)
    fix = Description(desc_id="d-2", lower=10, upper=20, attempt=1, corrects=(0, 10))
    for mode in ("strict", "add_columns"):
        write = build(mode).get_task("attempt_1.write")  # type: ignore[attr-defined]
        assert write.operator_class.__name__ == "IngestWriteOperator"  # one write operator for every mode
        op = write.operator_class(task_id="w", shard_url="file:///s", source_spec=write.partial_kwargs["source_spec"],
                                  slots=1, slot=0, desc=None, schema_mode=write.partial_kwargs["schema_mode"])
        assert op.job_request(d).schema_mode == mode, "the typed spark-submit request carries the mode"
        corr = op.job_request(fix)
        assert isinstance(corr, IngestCorrectRequest) and corr.schema_mode == mode, "so does a correction's"
