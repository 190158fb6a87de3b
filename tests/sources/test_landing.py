"""The landing-zone source without Spark: watermark, listing, reading, late and malformed files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink.core.updates import TIME
from shardsink.sources import LandingSource, LateDataError, MalformedInputError, Seal, source_from_spec
from shardsink.sources.landing import LandingFile, check_late, check_late_at, read_landing_file, slot_of
from shardsink_dev.synthetic import SCHEMA, generate, land_file, landing_table, publish_watermark

DAY = 86_400_000


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "landing")
    request.getfixturevalue("moto")
    return f"s3://shardsink-test/landing-{time.monotonic_ns()}"


def test_watermark_listing_and_spec_round_trip(root: str) -> None:
    src = LandingSource(root)
    assert src.watermark() is None
    per_day = generate(root, start=0, days=2, files_per_day=3, rows_per_file=10)
    assert src.watermark() == 2 * DAY and sum(per_day.values()) == 60
    keys = [f.key for f in src.files()]
    assert len(keys) == 6 and {k.rsplit(".", 1)[1] for k in keys} == {"parquet", "csv", "jsonl"}
    assert "_watermark.json" not in keys
    again = source_from_spec(json.loads(json.dumps(src.spec())))
    assert isinstance(again, LandingSource) and again.root == src.root
    assert src.schema() == SCHEMA


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_each_format_reads_as_shard_rows(tmp_path: Path, fmt: str) -> None:
    root = str(tmp_path)
    t = landing_table(0, DAY, 20, seed=1)
    land_file(root, f"a.{fmt}", t)
    src = LandingSource(root)
    got = read_landing_file(src.blob(), src.files()[0], SCHEMA, "event_time")
    assert got.schema.names == [*SCHEMA.names, TIME]
    assert sorted(got[TIME].to_pylist()) == sorted(t["event_time"].to_pylist())


def test_timestamp_event_times_become_milliseconds(tmp_path: Path) -> None:
    t = pa.table({"user": ["a"], "action": ["x"], "amount": [1],
                  "event_time": pa.array([1_500], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))})
    land_file(str(tmp_path), "t.parquet", t)
    src = LandingSource(str(tmp_path))
    assert read_landing_file(src.blob(), src.files()[0], SCHEMA, "event_time")[TIME].to_pylist() == [1_500]


@pytest.mark.parametrize(("name", "data", "needle"), [
    ("bad.parquet", b"not parquet", "is unreadable as parquet"),
    ("nots.csv", b"user,action,amount\na,b,1\n", "has no event-time column 'event_time'"),
    ("null.jsonl", b'{"user":"a","action":"b","amount":1,"event_time":null}\n', "null event time"),
    ("extra.csv", b"user,action,amount,zzz,event_time\na,b,1,2,5\n", "unexpected ['zzz']"),
])
def test_malformed_files_are_refused_naming_the_file(tmp_path: Path, name: str, data: bytes, needle: str) -> None:
    (tmp_path / name).write_bytes(data)
    src = LandingSource(str(tmp_path))
    with pytest.raises(MalformedInputError) as e:
        read_landing_file(src.blob(), src.files()[0], SCHEMA, "event_time", root=src.root)
    assert name in str(e.value) and needle in str(e.value)


def test_malformed_watermark_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_watermark.json").write_text('{"wm": 3}')
    with pytest.raises(MalformedInputError, match=r"_watermark\.json is malformed"):
        LandingSource(str(tmp_path)).watermark()
    publish_watermark(str(tmp_path), 7)
    assert LandingSource(str(tmp_path)).watermark() == 7


def test_late_file_is_refused_old_file_is_not() -> None:
    t = pa.table({"user": ["a", "b"], TIME: [100, 250]})
    seals = [Seal(-(2**63), 0, 0, 1000.0), Seal(0, 200, 1, 2000.0), Seal(200, 300, 2, 3000.0)]
    check_late(t, LandingFile("old.csv", 1, 1500.0), lower=300, seals=seals, root="r")  # there before the seal
    check_late(t, LandingFile("new.csv", 1, 9999.0), lower=100, seals=seals, root="r")  # nothing below lower
    with pytest.raises(LateDataError) as e:
        check_late(t, LandingFile("late.csv", 1, 2500.0), lower=300, seals=seals, root="r")
    assert "late file r/late.csv" in str(e.value) and "earliest event time 100" in str(e.value)
    assert "commit seqno 1" in str(e.value)


def test_unsealed_times_are_never_late_and_a_listing_seals_what_it_did_not_hold() -> None:
    """Seals as of listings: day [0, 200) listed at 2000.0 holding ``held.csv`` (appeared in the
    listing's own second); the shard's upper is 300, so times from 300 on are sealed by nobody."""
    seals = [Seal(-(2**63), 0, 0, 1000.0), Seal(0, 200, 1, 2000.0, frozenset({("held.csv", 2000.0)})),
             Seal(200, 300, 2, 3000.0)]
    # A description minted ahead ([400, 500)) reads files of the open days before it: not late.
    check_late_at(300, "open.csv", 9999.0, lower=400, seals=seals, root="r")
    check_late_at(350, "open.csv", 9999.0, lower=400, seals=[], root="r")
    # Listed (appeared before the listing, or held by it): on time.
    check_late_at(100, "old.csv", 1999.9, lower=300, seals=seals, root="r")
    check_late_at(100, "held.csv", 2000.0, lower=300, seals=seals, root="r")
    # Not held: the listing's own second counts as late, and so does anything after it.
    for key, appeared in (("same-second.csv", 2000.0), ("held.csv", 2000.5), ("after.csv", 2001.0)):
        with pytest.raises(LateDataError, match=rf"late file r/{key}: its earliest event time 100 was sealed by "
                                                r"commit seqno 1 .* as of a listing at 2000\.000"):
            check_late_at(100, key, appeared, lower=300, seals=seals, root="r")


def test_slot_assignment_is_stable_and_covers_every_file() -> None:
    keys = [f"day={d}/f-{i}.csv" for d in range(5) for i in range(7)]
    for n in (1, 2, 3):
        slots = [slot_of(k, n) for k in keys]
        assert slots == [slot_of(k, n) for k in keys] and set(slots) <= set(range(n))
    assert slot_of("day=1/f-1.csv", 2) == 0 or slot_of("day=1/f-1.csv", 2) == 1
