"""One maintenance pass (compact, since, GC, verify) and GC on a closed shard."""

from __future__ import annotations

import json

import pytest
from gc_helpers import SCHEMA, append_days, keys, rows

from shardsink import Shard
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.run import MaintenanceOptions, maintain
from shardsink.maintenance.since import set_retention
from shardsink.maintenance.verify import verify

pytestmark = pytest.mark.usefixtures("small_windows")


def test_maintain_summarises_before_and_after(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 3)
    lost = shard.stage(rows(0), lower=0, upper=10, desc_id="lost")
    objects_before = {o.key for o in shard._machine.blob.list("")}
    summary = maintain(shard, MaintenanceOptions(gc=GcOptions(grace_s=0)))
    objects_after = {o.key for o in shard._machine.blob.list("")}
    d = summary.to_dict()
    assert d["ok"] and d["problems"] == [] and d["leaks"] == 0
    assert d["steps"]["gc"] == "done" and d["steps"]["verify"] == "ok"
    for step in ("compact", "since", "sweep"):
        assert d["steps"][step].startswith("done"), d["steps"]
    # the lost description's part is the one object GC deleted (history is kept: no retention)
    assert d["objects_deleted"] == 1 and not {p.key for p in lost.parts} & objects_after
    assert (d["before"]["objects"], d["after"]["objects"]) == (len(objects_before), len(objects_after))
    assert d["after"]["batches"] <= d["before"]["batches"] and d["after"]["seqno"] >= d["before"]["seqno"]
    assert set(d["before"]) == {"seqno", "since", "upper", "batches", "parts", "bytes", "objects", "object_bytes",
                              "rows"}
    off = maintain(shard, MaintenanceOptions(compact=False, advance_since=False, gc=None, verify=False))
    assert off.steps == {"since": "disabled", "compact": "disabled", "sweep": "disabled", "gc": "disabled",
                         "verify": "disabled"}


def test_gc_of_a_closed_shard_keeps_it_readable(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 14)
    shard.close(expected_upper=140)
    before = Shard.open(shard_url).snapshot(139).num_rows
    report = collect(shard, GcOptions(grace_s=0, retention=1))
    assert report.versions_deleted > 0 and report.oldest_after <= report.head
    fresh = Shard.open(shard_url)
    assert fresh.info().upper is None and fresh.snapshot(139).num_rows == before
    assert verify(fresh).ok and keys(fresh, "state/v/")


def test_a_pass_commits_under_the_callers_writer_and_renders_for_operators(shard_url: str) -> None:
    """Since and compaction commits carry the pass's writer (an Airflow run names itself as an
    append does); the summary renders as text and its XCom form is structured data."""
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 3)
    set_retention(shard, "10ms")
    head = shard.info().seqno
    summary = maintain(shard, MaintenanceOptions(gc=GcOptions(grace_s=0)), writer="airflow:maint/run-1")
    commits = [c for seqno, c in shard.log(limit=50) if seqno > head]
    assert {c.kind for c in commits} >= {"since", "compact"}, commits
    assert {c.writer for c in commits} == {"airflow:maint/run-1"}
    text = summary.render()
    assert "Result(" not in text and "{" not in text and "since: 0 → " in text, text
    assert "compact: 3 batches → 1, 3 parts → 1, 6 rows" in text, text
    assert "verify: ok" in text and "gc: deleted " in text, text
    d = summary.to_dict()
    assert d["since"]["before"] == 0 and d["since"]["after"] > 0 and d["since"]["seqno"] is not None
    assert (d["compaction"]["batches_before"], d["compaction"]["batches_after"]) == (3, 1)
    assert [m["status"] for m in d["compaction"]["merges"]] == ["applied"] and d["swept"] == []
    assert json.loads(json.dumps(d)) == json.loads(json.dumps(d, default=str))  # plain JSON values only
