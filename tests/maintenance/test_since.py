"""Retention, since and leases: since = min(upper - retention, lowest leased as_of), never
backwards; reads below since refused with a clear error; retention set from the CLI and the
DAG factories through committed state transitions."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from support import SCHEMA, audit, table_of

from shardsink import InvalidUsageError, ReadFrontierError, Shard
from shardsink.cli import main
from shardsink.core import leases
from shardsink.maintenance import advance_since, compact, compaction_pass, parse_duration, retention_of, set_retention
from shardsink.storage.base import Blob


def fill(shard: Shard, n: int, span: int = 100) -> dict[str, list[tuple[str, int, int, int]]]:
    model = {}
    for i in range(n):
        rows = [(f"r{i}", i, i * span, 1), ("same", 0, i * span + 1, 1)]
        shard.append(table_of(rows), lower=i * span, upper=(i + 1) * span, desc_id=f"d{i}")
        model[f"d{i}"] = rows
    return model


def test_since_follows_upper_minus_retention_never_moves_back_and_is_a_logged_commit(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 10)  # upper 1000
    r = advance_since(shard)
    assert (r.before, r.after, r.seqno) == (0, 0, None), "no retention: since stays and nothing is written"
    assert set_retention(shard, "300ms") and not set_retention(shard, 300), "same retention: no new version"
    assert retention_of(shard) == 300 and shard.info().retention == 300
    r = advance_since(shard)
    assert (r.before, r.after) == (0, 700) and r.seqno == shard.info().seqno
    assert shard.log(limit=1)[0][1].kind == "since"
    set_retention(shard, "1s")  # a longer window cannot bring back what was compacted
    assert advance_since(shard).after == 700
    set_retention(shard, "1ms")
    assert advance_since(shard).after == 999, "since stops at upper - 1: the newest time stays readable"
    kinds = [c.kind for _, c in shard.log(limit=6)]
    assert kinds.count("retention") == 3 and kinds.count("since") == 2
    audit(blob, model, url=shard_url)


def test_a_live_lease_holds_since_at_its_as_of_and_an_expired_one_does_not(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    fill(shard, 10)
    set_retention(shard, 100)
    lease = leases.acquire(shard, 250, holder="reader", ttl_s=60)
    r = advance_since(shard)
    assert (r.after, r.lease_cap) == (250, 250), "since passed a live lease's as_of"
    assert shard.snapshot(250).num_rows > 0, "the leased as_of stays readable"
    later = time.time() + 60 + leases.CLOCK_SKEW_S + 1  # the lease expired (skew margin included)
    r = advance_since(shard, now=later)
    assert (r.after, r.lease_cap) == (900, None)
    leases.release(shard, lease)


def test_reads_below_since_are_refused_with_a_clear_error(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    fill(shard, 5)
    advance_since(shard, target=300)
    compact(shard)
    with pytest.raises(ReadFrontierError, match=r"as_of 299 .*since \(300\)"):
        shard.snapshot(299)
    with pytest.raises(ReadFrontierError, match="changes from 200 is before since 300"):
        shard.changes(200, 400)
    with pytest.raises(ReadFrontierError, match="before since"):
        leases.acquire(shard, 10, holder="late reader")
    assert list(blob.list("leases/")) == [], "a refused lease leaves no object"
    # At since the whole earlier history reads as one collapsed change set at time `since`.
    feed = shard.changes(300, 301).to_pylist()
    # r0, r1, r2 and three "same" inserts from before 300, plus r3 at 300 itself.
    assert {r["_time"] for r in feed} == {300} and sum(r["_diff"] for r in feed) == 7 and len(feed) == 5


def test_cli_sets_and_shows_retention_and_compacts(shard_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    fill(shard, 8)
    assert main(["retention", shard_url]) == 0
    assert "retention none (all history)" in capsys.readouterr().out
    assert main(["retention", shard_url, "--set", "2d"]) == 0
    assert "retention set to 2d" in capsys.readouterr().out
    assert main(["retention", shard_url, "--set", "48h"]) == 0
    assert "retention already 2d" in capsys.readouterr().out
    seqno = shard.info().seqno
    assert main(["retention", shard_url, "--set", "a week"]) == 2
    err = capsys.readouterr().err
    assert "retention 'a week' is not a duration" in err and shard.info().seqno == seqno, "bad input wrote something"
    assert main(["retention", shard_url, "--set", "500ms"]) == 0
    capsys.readouterr()
    assert main(["compact", shard_url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["since"]["after"] == 300 and out["batches_before"] == 8 and out["batches_after"] < 8
    assert all(m["status"] == "applied" for m in out["merges"])
    assert main(["inspect", shard_url, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["since"], d["retention"], d["batches"]) == (300, 500, out["batches_after"])
    assert main(["compact", shard_url]) == 0
    assert "since stays at 300" in capsys.readouterr().out


def test_parse_duration_accepts_units_and_refuses_nonsense() -> None:
    assert [parse_duration(x) for x in ("7d", "12h", "30m", "45s", "500ms", "2w", 5, timedelta(hours=1))] == [
        604_800_000, 43_200_000, 1_800_000, 45_000, 500, 1_209_600_000, 5, 3_600_000]
    assert parse_duration("none") is None and parse_duration(None) is None
    for bad in ("0s", "-1d", "7 days", "", 0):
        with pytest.raises(InvalidUsageError):
            parse_duration(bad)


def test_dag_retention_option_is_validated_at_parse_time_and_set_once_when_it_differs(shard_url: str) -> None:
    from shardsink.airflow.build import retention_spec
    from shardsink.airflow.tasks import ensure_retention

    assert retention_spec(None) is None and retention_spec("7d") == "604800000ms" and retention_spec("none") == "none"
    with pytest.raises(InvalidUsageError, match="not a duration"):
        retention_spec("seven days")
    shard = Shard.create(shard_url, SCHEMA)
    fill(shard, 2)
    ensure_retention(shard, retention_spec(timedelta(days=7)))
    seqno = shard.info().seqno
    assert shard.info().retention == 604_800_000 and shard.log(limit=1)[0][1].kind == "retention"
    ensure_retention(shard, retention_spec("1w"))  # the same window: nothing committed
    ensure_retention(shard, None)  # unmanaged: left alone
    assert shard.info().seqno == seqno
    ensure_retention(shard, retention_spec("none"))
    assert shard.info().retention is None and shard.info().seqno == seqno + 1


def test_compaction_pass_advances_since_then_compacts_at_it(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 16)
    set_retention(shard, "500ms")
    m = compaction_pass(shard)
    assert m.since is not None and m.compaction is not None
    assert m.since.after == 1100 and m.compaction.applied >= 1
    info = shard.info()
    assert info.rollup == info.seqno, "after merging, maintain rolls the batch list up: readers replay no diffs"
    for b in shard.batches():
        if b.desc_id.startswith("compact-"):
            assert min(p.min_time for p in b.parts) >= 1100, "the merge did not consolidate at the new since"
    audit(blob, model, url=shard_url)
