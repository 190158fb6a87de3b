"""What the Shards page reads from a shard, and the OpenLineage names of shards and sources (no Airflow)."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import ReadFrontierError, Shard
from shardsink.cli import main
from shardsink.maintenance.run import maintain
from shardsink.maintenance.since import set_retention
from shardsink.provider import inventory, lineage
from shardsink.provider.inventory import dag_run_of
from shardsink.sinks.description import Description
from shardsink.sinks.staging import write_manifest

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
DAY = 86_400_000


def _rows(lo: int, k: int) -> pa.Table:
    return pa.table({"user": [f"u{i}" for i in range(k)], "n": list(range(k)), "_time": [lo] * k})


def test_detail_shows_frontiers_commits_with_their_dag_runs_and_objects_by_class(tmp_path: Path) -> None:
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
    # Staged at the upper, its description may still commit: in flight however old, never leaked.
    assert [(o["cls"], o["key"]) for o in d["objects"]["objects"]] == [("in_flight", p.key) for p in stray.parts]
    assert "may still commit" in d["objects"]["objects"][0]["why"]
    assert {c: n["count"] for c, n in inventory.summary(url, grace_s=0)["objects"]["counts"].items()} == {
        "live": 2, "retained": 0, "in_flight": 1, "leaked": 0}
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


def _classified(url: str, capsys: pytest.CaptureFixture[str], t: float) -> dict[str, Any]:
    """The shard's objects by class as the Shards page (its JSON), ``inspect --objects``, ``verify``
    and ``gc --dry-run`` each give them at the clock ``t``: asserted the same, counts, bytes and
    every object's class; the page's returned."""
    page = inventory.detail(url, now=t)["objects"]
    got = [page]
    for argv in (["inspect", url, "--json", "--objects"], ["verify", url, "--json"],
                 ["gc", url, "--dry-run", "--json"]):
        assert main(argv, clock=lambda: t) == 0, argv
        got.append(json.loads(capsys.readouterr().out)["objects"])
    views = [({c: (n["count"], n["bytes"]) for c, n in o["counts"].items()},
              sorted((x["cls"], x["key"]) for x in o["objects"])) for o in got]
    assert all(v == views[0] for v in views), views
    return page


def _keys(objects: dict[str, Any], cls: str) -> set[str]:
    return {o["key"] for o in objects["objects"] if o["cls"] == cls}


def test_page_inspect_verify_and_gc_classify_objects_alike_before_and_after_the_grace_period_and_gc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's flow (appends, a maintenance pass compacting them, more appends, a crashed writer):
    the compacted-away parts await GC, with the time GC may take them once it is known; a part
    planted under parts/ that nothing references is the only leak, once older than the grace
    period; after ``gc`` nothing awaits GC or leaks. Same answer from every reader, judged at an
    injected clock."""
    monkeypatch.setattr("shardsink.core.transitions.RECENT_DESCS", 4)  # a few appends slide the idempotency window
    monkeypatch.setattr("shardsink.core.machine.ROLLUP_EVERY", 4)
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA, upper=DAY)
    set_retention(shard, 2 * DAY)
    for day in range(1, 7):
        shard.append(_rows(day * DAY, 3), lower=day * DAY, upper=(day + 1) * DAY)
    appended = {p.key for b in shard.batches() for p in b.parts}
    assert maintain(shard).ok  # since, compaction, sweep, GC (nothing old enough), verify
    page = _classified(url, capsys, time.time())
    assert _keys(page, "retained") == appended and page["counts"]["leaked"]["count"] == 0
    waiting = {o["why"] for o in page["objects"]}
    assert all(o["gc_after"] is None for o in page["objects"]) and len(waiting) == 1, waiting
    assert "more descriptions committing" in waiting.pop()  # time alone does not release them yet

    for day in range(7, 11):
        shard.append(_rows(day * DAY, 3), lower=day * DAY, upper=(day + 1) * DAY)
    crashed = Description("crashed-a1", 11 * DAY, 12 * DAY, 1)  # staged at the upper: it may still commit
    write_manifest(shard, crashed, slot=0, slots=1, parts=shard.stage(
        _rows(11 * DAY, 1), lower=crashed.lower, upper=crashed.upper, desc_id=crashed.desc_id).parts)
    flying = {o.key for o in shard.admin().list_staged(crashed.desc_id)}
    buf = io.BytesIO()
    pq.write_table(_rows(DAY, 1), buf)
    planted = "parts/planted/0.parquet"
    shard._machine.blob.put(planted, buf.getvalue())

    t0 = time.time()
    page = _classified(url, capsys, t0)  # everything younger than the grace period
    assert _keys(page, "retained") == appended and _keys(page, "in_flight") == flying | {planted}
    assert page["counts"]["leaked"]["count"] == 0
    assert all(t0 < o["gc_after"] <= t0 + 3600 for o in page["objects"] if o["cls"] == "retained"), page
    t1 = t0 + 2 * 3600
    page = _classified(url, capsys, t1)
    assert _keys(page, "retained") == appended and _keys(page, "in_flight") == flying
    assert _keys(page, "leaked") == {planted}, "the planted part is the only leak"
    assert all("the next `shardsink gc` deletes it" in o["why"] for o in page["objects"] if o["cls"] == "retained")

    assert main(["gc", url], clock=lambda: t1) == 0
    capsys.readouterr()
    page = _classified(url, capsys, t1)
    assert [(o["cls"], o["key"]) for o in page["objects"]] == [("in_flight", k) for k in sorted(flying)]
    assert page["counts"]["live"]["count"] == len({p.key for b in shard.batches() for p in b.parts})


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
