"""End to end with real Airflow (`airflow dags test`): real spark-submit at local[2], and Spark Connect."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pyarrow.compute as pc
from af_helpers import DAY, REPO, START, VENV_BIN, Env, assert_exactly_once, assert_no_leaks, ok
from pyiceberg.table import StaticTable

from shardsink import Shard, iceberg
from shardsink_dev.synthetic import generate, publish_watermark


def test_every_dag_file_imports_cleanly_and_the_view_dag_is_scheduled_on_the_ingest_shards_asset(af: Env) -> None:
    """Every DAG file of dags/, and the DAG template a new user copies (docs/templates/), as written:
    the template's DAG starts at its start_date and writes where it says. In the same DagBag (one
    Airflow import, not two), the example view DAG has its attempts' tasks and is scheduled on
    the ingest shard's asset: its runs follow the ingest's commits."""
    template = REPO / "docs" / "templates" / "my_ingest_dag.py"
    script = textwrap.dedent(f"""
        from datetime import UTC, datetime
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag()
        assert not bag.import_errors, bag.import_errors
        assert bag.dags, "no DAGs found"
        d = bag.dags["example_ingest"]
        ids = sorted(t.task_id for t in d.tasks)
        assert "attempt_1.mint" in ids and "attempt_5.append" in ids, ids
        print("DAGS", sorted(bag.dags))
        v = bag.dags["example_view"]
        vids = sorted(t.task_id for t in v.tasks)
        assert "attempt_1.mint" in vids and "attempt_5.append" in vids, vids
        print("ASSETS", [a.uri for a in v.timetable.asset_condition.objects])
        mine = DagBag(dag_folder={str(template)!r})
        assert not mine.import_errors, mine.import_errors
        t = mine.dags["my_dataset_ingest"]
        assert t.start_date == datetime(2025, 1, 1, tzinfo=UTC), t.start_date
        assert t.get_task("attempt_1.write").partial_kwargs["shard_url"] == "s3://my-bucket/shards/my_dataset"
        print("TEMPLATE", t.dag_id)
    """)
    out = ok(subprocess.run([str(VENV_BIN / "python"), "-c", script], env=af.env, capture_output=True, text=True,
                            timeout=120))
    assert "example_ingest" in out and "TEMPLATE my_dataset_ingest" in out
    assert f"ASSETS ['{Shard(af.shard_url).url}']" in out, out[-2000:]  # the view DAG's schedule


def test_runs_ingest_exactly_once_and_rerun_changes_nothing(af: Env, connect_engine: dict[str, str]) -> None:
    """The first run writes with two slots (the DAG's default; multi-slot ingest is proved here),
    the second with one: what it adds is the next interval after a committed one. Both write over
    Spark Connect (``SHARDSINK_ENGINE=connect``): each slot a client session of the test process's
    one server, no spark-submit; the spark-submit engine runs in the other DAG tests. The DAG keeps
    an Iceberg view (``SHARDSINK_ICEBERG=1``): the first append turns it on (one option commit); the
    upkeep of each later commit runs on a background worker of the task's process, and the view is
    current once the run is done; pyiceberg reads what the shard holds."""
    af.env.update(connect_engine)
    af.env["SHARDSINK_ICEBERG"] = "1"
    generate(af.landing, start=START, days=2, files_per_day=2, rows_per_file=150)
    first = ok(af.dags_test("2024-01-02"))  # covers [Jan 1, Jan 2)
    assert first.count("over Spark Connect (connection 'spark_connect_default')") == 2
    assert "Spark-Submit cmd" not in first
    shard = Shard.open(af.shard_url)
    assert shard.info().upper == START + DAY
    ok(af.dags_test("2024-01-03", extra={"SHARDSINK_WRITERS": "1"}))
    info = shard.info()
    assert info.upper == START + 2 * DAY and info.seqno == 3  # append, the Iceberg option, append
    assert_exactly_once(af.shard_url, af.landing, START, START + 2 * DAY)
    assert_no_leaks(af.shard_url)
    events = af.asset_events()
    assert [(e["lower"], e["upper"], e["seqno"]) for e in events] == [
        (START, START + DAY, 1), (START + DAY, START + 2 * DAY, 3)]
    view = StaticTable.from_metadata(iceberg.current_location(shard))
    assert view.current_snapshot().summary["shardsink.seqno"] == "3"  # current once the run is done
    assert pc.sum(pc.fill_null(view.scan().to_arrow()["_diff"], 1)).as_py() == 600
    assert sum(e["rows"] for e in events) == 600 and events[0]["shard"] == af.shard_url

    out = ok(af.dags_test("2024-01-03"))  # a re-run of a completed interval
    assert "nothing to do" in out and f"shard upper {START + 2 * DAY}" in out
    assert "Spark-Submit cmd" not in out
    assert shard.info().seqno == 3
    assert_exactly_once(af.shard_url, af.landing, START, START + 2 * DAY)


def test_watermark_that_does_not_move_skips_without_a_jvm(af: Env, tmp_path: Path,
                                                         connect_engine: dict[str, str]) -> None:
    """Two no-op runs (their own interval, then a later one) start no spark-submit; once half a day
    completes, the next run takes just that (its one write slot a Spark Connect session).

    One writer slot: the day has one file, so a second slot would stage nothing. Multi-slot ingest
    is covered by the exactly-once test."""
    af.env["SHARDSINK_WRITERS"] = "1"
    generate(af.landing, start=START, days=1, files_per_day=1, rows_per_file=10, watermark=START)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    marker = tmp_path / "spark-submit-was-called"
    (fake / "spark-submit").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (fake / "spark-submit").chmod(0o755)
    env = {"PATH": f"{fake}:{af.env['PATH']}"}
    for day in ("2024-01-02", "2024-01-03"):
        out = ok(af.dags_test(day, extra=env))
        assert "nothing to do: nothing new is complete" in out
        assert f"watermark {START}" in out and f"shard upper {START}" in out
    assert not marker.exists(), "a no-op run started spark-submit"
    assert Shard.open(af.shard_url).info().seqno == 0
    publish_watermark(af.landing, START + DAY // 2)  # half a day completes: the next run takes just that
    ok(af.dags_test("2024-01-02", extra=connect_engine))
    assert Shard.open(af.shard_url).info().upper == START + DAY // 2
    assert_exactly_once(af.shard_url, af.landing, START, START + DAY // 2)
