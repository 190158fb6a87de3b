"""File arrivals, reclocked: library-level runs with real Spark (local[2]) on both backends."""

from __future__ import annotations

import os
import time
from typing import Any

from rc_helpers import DAY, SCHEMA, START, assert_exactly_once, assert_no_leaks, land, run_once, times_of

from shardsink import Shard
from shardsink.reclock.bindings import FILES
from shardsink.reclock.health import read_sidecar, record_failure, status
from shardsink.reclock.remap import RemapShard
from shardsink.sinks.description import Description, NoOp
from shardsink.sources.files import FileArrivals


def urls(shard_url: str) -> tuple[str, str, str]:
    return f"{shard_url}/landing", f"{shard_url}/events", f"{shard_url}/remap"


def test_files_are_ingested_exactly_once_stamped_with_their_binding_time(spark: Any, shard_url: str) -> None:
    root, data, remap = urls(shard_url)
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    ids = land(root, "a/1.parquet", range(0, 50)) + land(root, "a/2.csv", range(50, 80))
    d1 = run_once(spark, data, src, interval_end=START + DAY)
    assert isinstance(d1, Description) and (d1.lower, d1.upper) == (START, START + DAY)
    ids += land(root, "b/3.jsonl", range(80, 100))
    d2 = run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert isinstance(d2, Description)
    assert_exactly_once(data, ids)
    assert_no_leaks(data)
    times = times_of(data)
    assert {times[i] for i in range(80)} == {START + DAY - 1}, "first binding's files get its time"
    assert {times[i] for i in range(80, 100)} == {START + 2 * DAY - 1}
    b = RemapShard.open(remap).bindings()
    assert [(x.time, x.frontier) for x in b.history] == [(START + DAY - 1, {FILES: 2}),
                                                         (START + 2 * DAY - 1, {FILES: 3})]
    assert [f.key for f in b.history[1].files] == ["b/3.jsonl"]
    assert read_sidecar(data) == {"remap": RemapShard.open(remap).url, "source": src.spec()}
    r = RemapShard.open(remap)
    assert status(r, r.bindings())["status"] == "running"

    # Nothing new: the next interval seals an empty batch and the source reports idle.
    d3 = run_once(spark, data, src, interval_end=START + 3 * DAY)
    assert isinstance(d3, Description)
    assert Shard.open(data).info().upper == START + 3 * DAY
    assert status(r, r.bindings())["status"] == "idle"
    record_failure(remap, "StorageError: listing s3://x failed")
    assert status(r, r.bindings())["status"] == "failing"
    run_once(spark, data, src, interval_end=START + 4 * DAY)  # a later binding clears the failure
    assert status(r, r.bindings())["status"] == "idle"
    # A re-run of a sealed interval does nothing.
    assert isinstance(run_once(spark, data, src, interval_end=START + 2 * DAY), NoOp)
    assert_exactly_once(data, ids)


def test_a_file_younger_than_the_settle_delay_waits_for_the_next_binding(spark: Any, tmp_path: Any) -> None:
    root, data, remap = str(tmp_path / "landing"), (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    now = [time.time()]
    src = FileArrivals(root, remap=remap, settle_seconds=60, schema=SCHEMA, clock=lambda: now[0])
    ids = land(root, "old.parquet", range(10))
    now[0] += 61
    ids += land(root, "arriving.parquet", range(10, 20))  # lands "during the listing": 1 s old
    os.utime(tmp_path / "landing" / "arriving.parquet", (now[0] - 1, now[0] - 1))
    run_once(spark, data, src, interval_end=START + DAY)
    assert set(times_of(data)) == set(range(10))
    now[0] += 61
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_exactly_once(data, ids)
    assert {times_of(data)[i] for i in range(10, 20)} == {START + 2 * DAY - 1}
