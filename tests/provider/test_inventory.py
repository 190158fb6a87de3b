"""What the Shards page reads from a shard, and the OpenLineage names of shards and sources (no Airflow)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import ReadFrontierError, Shard
from shardsink.cli import main
from shardsink.provider import inventory, lineage
from shardsink.provider.inventory import dag_run_of
from shardsink.sinks.description import Description
from shardsink.sinks.staging import write_manifest

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
DAY = 86_400_000


def _rows(lo: int, k: int) -> pa.Table:
    return pa.table({"user": [f"u{i}" for i in range(k)], "n": list(range(k)), "_time": [lo] * k})


def test_detail_shows_frontiers_commits_with_their_dag_runs_and_leaked_parts(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA, upper=DAY)
    shard.append(_rows(DAY, 3), lower=DAY, upper=2 * DAY, writer="airflow:ingest/scheduled__2024-01-02T00:00:00+00:00")
    shard.append(_rows(2 * DAY, 2), lower=2 * DAY, upper=3 * DAY, writer="cli:me")
    stray = shard.stage(_rows(3 * DAY, 1), lower=3 * DAY, upper=4 * DAY, desc_id="never-committed")

    d = inventory.detail(url, grace_s=0)
    assert (d["seqno"], d["upper"], d["upper_time"], d["rows"], d["batches"]) == (2, 3 * DAY,
                                                                                 "1970-01-04T00:00:00.000Z", 5, 2)
    assert [c["seqno"] for c in d["commits"]] == [2, 1, 0] and d["history_complete"]
    assert [(c["dag_id"], c["run_id"]) for c in d["commits"]] == [
        (None, None), ("ingest", "scheduled__2024-01-02T00:00:00+00:00"), (None, None)]
    assert [c["shard_upper"] for c in d["commits"]] == [3 * DAY, 2 * DAY, DAY]
    assert [o["key"] for o in d["leaked_list"]] == [p.key for p in stray.parts] and d["leaked"] == 1
    assert inventory.summary(url, grace_s=3600)["leaked"] == 0  # young parts may be an in-flight writer's
    assert d["retention_ms"] is None and d["lease_list"] == []
    assert inventory.shard_id(url) == inventory.shard_id(url + "/") == d["id"]
    assert d["staged_waiting"] == []  # staged parts without a manifest: no description waiting

    # A backfill's later days, staged ahead of the upper (3 DAY): the band the page draws ahead of it.
    for day, slots in ((4, 2), (3, 1)):
        desc = Description(f"backfill-day-{day}", day * DAY, (day + 1) * DAY, 1)
        staged = shard.stage(_rows(day * DAY, 1), lower=desc.lower, upper=desc.upper, desc_id=desc.desc_id)
        write_manifest(shard, desc, slot=0, slots=slots, parts=staged.parts)
    band = inventory.detail(url, grace_s=3600)["staged_waiting"]
    assert [(w["desc_id"], w["lower"], w["upper"], w["lower_time"], w["staged_slots"], w["slots"], w["turn"])
            for w in band] == [
        ("backfill-day-3", 3 * DAY, 4 * DAY, "1970-01-04T00:00:00.000Z", 1, 1, "next"),
        ("backfill-day-4", 4 * DAY, 5 * DAY, "1970-01-05T00:00:00.000Z", 1, 2, "waiting")]
    assert band[1]["upper_time"] == "1970-01-06T00:00:00.000Z"


def test_preview_shows_the_first_rows_as_of_a_time_and_refuses_unreadable_times(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA, upper=DAY)
    shard.append(_rows(DAY, 150), lower=DAY, upper=2 * DAY)
    shard.append(_rows(2 * DAY, 1), lower=2 * DAY, upper=3 * DAY)
    p = inventory.preview(url)
    assert (p["as_of"], p["total_rows"], len(p["rows"])) == (3 * DAY - 1, 150, 100)
    assert p["columns"] == ["user", "n", "_count"]
    assert inventory.preview(url, as_of=2 * DAY - 1)["total_rows"] == 150
    with pytest.raises(ReadFrontierError):
        inventory.preview(url, as_of=3 * DAY)


def test_dag_run_of_parses_only_airflow_writers() -> None:
    assert dag_run_of("airflow:d/manual__2024-01-01T00:00:00+00:00") == ("d", "manual__2024-01-01T00:00:00+00:00")
    assert dag_run_of("airflow:d/") is None and dag_run_of("host:123") is None


def test_lineage_names_follow_the_openlineage_conventions() -> None:
    assert lineage.shard_dataset("s3://lake/shards/events") == lineage.DatasetName("s3://lake", "shards/events")
    assert lineage.shard_dataset("file:///data/shards/e") == lineage.DatasetName("file", "/data/shards/e")
    assert lineage.source_datasets({"kind": "landing", "root": "s3://lake/landing/events"}) == [
        lineage.DatasetName("s3://lake", "landing/events")]
    assert lineage.source_datasets({"kind": "landing", "root": "/srv/landing"}) == [
        lineage.DatasetName("file", "/srv/landing")]
    assert lineage.source_datasets({"kind": "kafka", "bootstrap_servers": "b1:9092,b2:9092", "topic": "clicks"}) == [
        lineage.DatasetName("kafka://b1:9092", "clicks")]
    view = {"kind": "sql", "inputs": {"a": {"url": "s3://lake/x", "mode": "updates"}, "b": {"url": "file:///y"}}}
    assert lineage.source_datasets(view) == [lineage.DatasetName("s3://lake", "x"), lineage.DatasetName("file", "/y")]


def test_detail_and_the_schema_route_show_the_schema_history_as_shardsink_schema_json_prints_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA, upper=DAY)
    shard.append(_rows(DAY, 3), lower=DAY, upper=2 * DAY)
    assert main(["schema", url, "--add", "score:double"]) == 0
    assert main(["schema", url, "--rename", "user:who"]) == 0
    capsys.readouterr()
    assert main(["schema", url, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)

    d = inventory.detail(url)
    assert d["schema_history"] == printed == inventory.schema_history(url)["schemas"]
    assert d["schema_id"] == 2 and [s["name"] for s in d["schema"]] == ["who", "n", "score"]
    assert [(e["id"], e["seqno"], e["upper"]) for e in printed] == [(0, 0, None), (1, 2, 2 * DAY), (2, 3, 2 * DAY)]
    assert printed[0]["at"] is None  # the implicit first schema: made at creation, time not recorded
    ages = [dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(e["at"]) for e in printed[1:]]
    assert all(dt.timedelta(0) <= a < dt.timedelta(minutes=5) for a in ages), ages
    assert [(f["id"], f["name"], f["type"]) for f in printed[-1]["fields"]] == [
        (1, "who", "string"), (2, "n", "int64"), (3, "score", "double")]
    assert [(f["id"], f["name"]) for f in printed[0]["fields"]] == [(1, "user"), (2, "n")]
    assert d["seqno"] == 3 and {c["kind"] for c in d["commits"][:2]} == {"schema"}
