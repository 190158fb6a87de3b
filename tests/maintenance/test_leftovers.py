"""Leftover listings and ``verify``: what a crashed or running writer left, with its age and its fate.

A writer that crashed a minute ago, or one still running, leaves staged objects the shard does
not reference. While its description may still commit they are in flight, not leaks, whatever
their age; anything else unreferenced is in flight while younger than the grace period (its
writer may still be committing or deleting it) and leaked after it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from gc_helpers import SCHEMA, SPAN, append_days, rows

from shardsink import Shard
from shardsink.cli import main
from shardsink.maintenance.leftovers import leftovers
from shardsink.maintenance.verify import verify
from shardsink.sinks.append import cleanup
from shardsink.sinks.description import Description
from shardsink.sinks.staging import write_manifest

TEMP = "parts/running/spark-0a1b/_temporary/0/task_1/part-00000.parquet"


@pytest.fixture
def shard(shard_url: str) -> Shard:
    s = Shard.create(shard_url, SCHEMA)
    append_days(s, 0, 3)  # upper 30
    return s


def _crashed_writer(shard: Shard) -> Description:
    """A description at the shard's upper whose slot 0 staged a part and its manifest, then died."""
    d = Description("crashed-a1-0000", 3 * SPAN, 4 * SPAN, 1)
    staged = shard.stage(rows(3), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=2, parts=staged.parts)
    return d


def _age(shard_url: str, key: str, seconds: float) -> None:
    """Make a local object ``seconds`` old (the store's modification time is its age)."""
    path = os.path.join(shard_url.removeprefix("file://"), key)
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_a_writer_that_crashed_a_minute_ago_is_listed_as_still_possible_with_its_age(shard: Shard) -> None:
    d = _crashed_writer(shard)
    lost = shard.stage(rows(1), lower=SPAN, upper=2 * SPAN, desc_id="lost-a1-0000")  # upper passed its lower
    [*got] = leftovers(shard)
    by = {x.desc_id: x for x in got}
    assert set(by) == {d.desc_id, "lost-a1-0000"}
    crashed = by[d.desc_id]
    assert (crashed.fate, crashed.lower, crashed.parts, crashed.manifests) == ("still_possible", 30, 1, 1)
    assert crashed.note == "shard upper 30 = its lower 30, from its manifests"
    assert 0 <= crashed.youngest_s < 60, "a minute-old leftover is listed, with its age"
    gone = by["lost-a1-0000"]
    assert (gone.fate, gone.parts, gone.lower) == ("cannot_commit", len(lost.parts), SPAN)
    assert "first _time" in gone.note  # no manifest: the lower came from a part
    assert [x.desc_id for x in leftovers(shard, desc_id=d.desc_id)] == [d.desc_id]


def test_verify_reports_a_running_writer_in_flight_and_a_dead_one_as_leaked_after_the_grace_period(
        shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    d = _crashed_writer(shard)
    shard.stage(rows(1), lower=SPAN, upper=2 * SPAN, desc_id="lost-a1-0000")
    shard._machine.blob.put(TEMP, b"PAR1 half a file")  # a Spark task attempt writing now
    report = verify(shard)
    assert report.ok and report.leaks == ()  # everything is younger than the grace period
    assert {x.object.split("/")[1] for x in report.in_flight} == {d.desc_id, "running", "lost-a1-0000"}
    later = time.time() + 3601  # past the grace period
    report = verify(shard, now=later)
    flying = {x.object: x.why for x in report.in_flight}
    assert {k.split("/")[1] for k in flying} == {d.desc_id}
    assert all("may still commit" in w for w in flying.values())
    assert {x.object.split("/")[1] for x in report.leaks} == {"lost-a1-0000", "running"}
    assert main(["verify", shard.url, "--json"], clock=lambda: later) == 0
    out = json.loads(capsys.readouterr().out)
    assert {x["object"] for x in out["in_flight"]} == set(flying)
    assert main(["verify", shard.url], clock=lambda: later) == 0
    text = capsys.readouterr().out
    assert "2 in flight (" in text and "2 leaked (" in text and f"leak      {TEMP}" in text


def test_old_temporary_files_of_a_dead_job_are_leaks(tmp_path: Path) -> None:
    shard_url = (tmp_path / "s").as_uri()  # ages are set through the local file system
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 2)
    shard._machine.blob.put(TEMP, b"PAR1 half a file")
    _age(shard_url, TEMP, 7200)
    report = verify(shard)
    assert [x.object for x in report.leaks] == [TEMP] and report.in_flight == ()
    assert [x.object for x in verify(shard, grace_s=86400).in_flight] == [TEMP]


def test_once_the_upper_passes_it_the_crashed_writers_objects_are_leaks(shard: Shard) -> None:
    d = _crashed_writer(shard)
    shard.append(pa.table({"k": ["z"], "_time": [35]}), lower=30, upper=40, desc_id="rerun-a1")
    report = verify(shard, grace_s=0)
    assert report.in_flight == ()
    assert {x.object.split("/")[1] for x in report.leaks} == {d.desc_id}
    assert [x.fate for x in leftovers(shard)] == ["cannot_commit"]


def test_cleanup_refuses_a_description_id_string(shard: Shard) -> None:
    """The failed-writer runbook's old script passed ``desc.desc_id``: refused by name, nothing deleted."""
    d = _crashed_writer(shard)
    with pytest.raises(Exception, match="cleanup takes the Description"):
        cleanup(shard, d.desc_id)  # type: ignore[arg-type]
    assert [x.parts for x in leftovers(shard)] == [1]
