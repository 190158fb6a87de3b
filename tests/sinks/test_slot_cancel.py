"""sinks/cancel.py: a writer slot's final failure, recorded in the shard's store, reaches its
siblings (before they start, and while they run), in its run generation only; verify does not
call it a leak and GC expires it after its grace period. Real local shards, a real thread.
The Spark side (the running sibling's application killed) is tests/airflow/test_write_failures.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.errors import InvalidUsageError
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.verify import verify
from shardsink.sinks.cancel import SlotCancels, SlotFailure, marker_key


@pytest.fixture
def url(tmp_path: Path) -> str:
    return Shard.create((tmp_path / "shard").as_uri(), pa.schema([("k", pa.string())]), upper=0).url


def test_a_recorded_failure_is_seen_in_its_generation_only(url: str) -> None:
    mine, cleared = SlotCancels(url, "d-r-a1-0001", generation=0), SlotCancels(url, "d-r-a1-0001", generation=1)
    other = SlotCancels(url, "d-r-a1-0002", generation=0)
    assert mine.failure() is None
    mine.record(1, "InvalidUsageError: LateDataError: late file x")
    got = mine.failure()
    assert isinstance(got, SlotFailure) and (got.slot, got.generation, got.desc_id) == (1, 0, "d-r-a1-0001")
    assert got.reason == "InvalidUsageError: LateDataError: late file x"
    assert cleared.failure() is None and other.failure() is None  # a cleared run's new tries, another description
    Shard(url)._machine.blob.put(cleared.key, b"not a record")  # unreadable: cancels nothing
    assert cleared.failure() is None
    for bad_generation in (-1, True, 2**31, "0"):
        with pytest.raises(InvalidUsageError, match="is not a clear number"):
            marker_key("d", bad_generation)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError, match="description id"):
        marker_key("../state", 0)


def test_a_running_slot_hears_of_the_failure_and_keeps_hearing_until_its_block_ends(url: str) -> None:
    cancels = SlotCancels(url, "d-r-a1-0003", generation=0)
    heard: list[SlotFailure] = []
    twice = threading.Event()

    def on_failure(f: SlotFailure) -> None:
        heard.append(f)
        if len(heard) >= 2:
            twice.set()

    with cancels.watching(on_failure, every=0.02):
        SlotCancels(url, "d-r-a1-0003", generation=0).record(0, "CorruptionError: part missing")  # the sibling
        assert twice.wait(30), "the watcher never reported the sibling's failure"
    n = len(heard)
    assert {f.slot for f in heard} == {0}
    assert len(heard) == n  # the thread stopped with the block


def test_verify_knows_the_marker_and_gc_expires_it_after_grace(url: str) -> None:
    cancels = SlotCancels(url, "d-r-a1-0004", generation=0)
    cancels.record(1, "StorageError: 503")
    report = verify(Shard.open(url))
    assert report.ok and not [x for x in report.leaks if "cancel/" in x.object], report.leaks
    assert collect(Shard.open(url), GcOptions(grace_s=3600)).plans_deleted == 0  # young: kept
    assert cancels.failure() is not None
    assert collect(Shard.open(url), GcOptions(grace_s=0)).plans_deleted == 1
    assert cancels.failure() is None
