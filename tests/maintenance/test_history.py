"""GC's cheap view of the retained history: the removal chain protects exactly what reading
every retained version would, and a GC from a fresh handle reads one version per
compaction, not the whole retained history."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from gc_helpers import SCHEMA, append_days, compact_like, contents

from shardsink import Shard
from shardsink.core import leases as ls
from shardsink.maintenance import (
    CompactOptions,
    MaintenanceOptions,
    ScheduleOptions,
    compact,
    compaction_pass,
    set_retention,
)
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.history import list_state, protected, referenced, removals
from shardsink.maintenance.verify import verify
from shardsink.storage.s3 import S3Blob

pytestmark = pytest.mark.usefixtures("small_windows")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "shard-format1"


def _history(url: str) -> Shard:
    """Appends, compactions of appends, a compaction of a compaction output, in between."""
    shard = Shard.create(url, SCHEMA)
    append_days(shard, 0, 8)
    compact_like(shard, ["d0", "d1", "d2"], "cmp1")
    append_days(shard, 8, 6)
    compact_like(shard, ["cmp1", "d3", "d4"], "cmp2")       # cmp1 lived for a while, then went
    compact_like(shard, ["d8", "d9"], "cmp3")
    append_days(shard, 14, 5)
    compact_like(shard, ["d10", "d11", "d12"], "cmp4")
    append_days(shard, 19, 2)
    return shard


def test_the_removal_chain_protects_exactly_what_reading_every_retained_version_does(shard_url: str) -> None:
    shard = _history(shard_url)
    m = shard.admin()
    listing = list_state(m)
    head = m.head()
    every_part = {o.key for o in m.list_parts()}
    for oldest in range(head.seqno + 1):
        full = referenced(m, oldest, head.seqno, listing)
        cheap = protected(m, oldest, head, listing)
        assert {k for k in every_part if cheap.covers(k)} == set(full.parts), f"retained from version {oldest}"
    assert removals(m, head, above=0) is not None


def test_a_gc_from_a_fresh_handle_reads_one_version_per_compaction_not_the_retained_history(
        s3_client: Any, moto: Any) -> None:
    url = "s3://shardsink-test/fresh-gc-reads"
    shard = Shard.create(url, SCHEMA)
    set_retention(shard, 600)  # 60 days of 10 ms: versions older than that are condemned
    for day in range(0, 240, 30):
        append_days(shard, day, 30)
        compaction_pass(Shard.open(url), MaintenanceOptions(sweep_grace_s=3600))
    before = contents(Shard.open(url))
    head = Shard.open(url).info().seqno
    fresh = Shard.open(url)
    gets: list[str] = []
    blob = fresh._machine.raw
    assert isinstance(blob, S3Blob)
    blob.client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: gets.append(str(params.get("Key", ""))))
    report = collect(fresh, GcOptions(grace_s=0, retention="shard"))
    retained = head - report.oldest_after
    version_reads = [k for k in gets if "/state/v/" in k]
    assert report.versions_deleted > 100 and retained > 60, report
    # Reading every retained version would be > 60 GETs; the chain needs one per compaction
    # (a handful in the retained stretch), the batch lists at oldest and head (rollup + at most
    # 4 diffs each here), and a bisection for the retention bound.
    assert len(version_reads) < 40, (len(version_reads), retained)
    assert contents(Shard.open(url)) == before
    assert verify(Shard.open(url)).ok


def test_a_shard_written_before_the_removal_chain_is_collected_by_reading_its_history(tmp_path: Path) -> None:
    root = tmp_path / "old"
    shutil.copytree(FIXTURE, root)
    shard = Shard.open(root.as_uri())
    assert removals(shard.admin(), shard._machine.head().version, above=0) is None
    result = compact(shard, options=CompactOptions(schedule=ScheduleOptions(fan_in=4)))
    assert result.applied >= 1
    # The chain is known from the first compaction on, unknown below it.
    head = shard._machine.head().version
    assert head.header.removal is not None and removals(shard.admin(), head, above=0) is None
    for i in range(6):  # move on past the compaction, so that its inputs fall out of retention
        lo = 400 + 10 * i
        shard.append(pa.table({"k": [f"x{i}"], "n": [i], "_time": [lo]}), lower=lo, upper=lo + 10, desc_id=f"x{i}")
    # The fixture's lease pins version 32, below the compaction: the chain is unknown in the
    # retained stretch, so GC reads every retained version and keeps the compacted-away parts.
    parts = {o.key for o in shard._machine.blob.list("parts/")}
    first = collect(Shard.open(root.as_uri()), GcOptions(grace_s=0, retention=30))
    assert first.oldest_after == 32 and first.parts_deleted == 1  # only the staged-only leftover's part
    assert {o.key for o in shard._machine.blob.list("parts/")} >= parts - {p for p in parts if "/staged-only/" in p}
    (lease,) = shard.leases()
    ls.release(shard, lease)  # the fixture's reader is done: its lease no longer pins version 32
    before = Shard.open(root.as_uri()).snapshot().sort_by("k").to_pylist()
    report = collect(Shard.open(root.as_uri()), GcOptions(grace_s=0, retention=30))
    # Retained from the compaction on: its inputs are referenced by no retained version, and
    # the chain is known for everything retained (its unknown part lies below).
    assert report.oldest_after == head.seqno, (report.reason, report.oldest_after)
    assert removals(shard.admin(), shard._machine.head().version, above=report.oldest_after) is not None
    assert report.parts_deleted >= 40
    assert Shard.open(root.as_uri()).snapshot().sort_by("k").to_pylist() == before
    assert verify(Shard.open(root.as_uri())).ok
