"""Late-data evidence: only commits whose kind seals times are seals (sinks/seals.py).

A compaction, since advance, retention change or schema change carries other numbers in its
commit record (a merged range, old and new values); none of them may make a late file look
on time, or the file's rows below the run's lower are silently dropped.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from support.fake_source import rows

from shardsink import Shard
from shardsink.core.commits import END_OF_TIME, MIN_TIME, Listing
from shardsink.core.schema import SchemaChange
from shardsink.core.updates import TIME
from shardsink.errors import InvalidUsageError
from shardsink.maintenance import advance_since, compact, set_retention
from shardsink.maintenance.compact import CompactOptions
from shardsink.maintenance.schedule import ScheduleOptions
from shardsink.sinks.seals import seals
from shardsink.sources.base import Seal
from shardsink.sources.landing import LandingFile, LateDataError, check_late
from shardsink.storage import open_blob
from shardsink_dev.synthetic import SCHEMA

DAY = 86_400_000
SEALING = {"create", "append", "close"}


def _at(shard: Shard, seqno: int) -> float:
    c = dict(shard.log(limit=100))[seqno]
    return datetime.fromisoformat(c.at).timestamp()


def _maintained(shard_url: str) -> Shard:
    """Two sealed days, then every kind of commit that seals nothing: compaction, retention,
    since and schema commits (seqnos 3-6)."""
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    shard.append(rows(0, 3), lower=0, upper=DAY)
    shard.append(rows(DAY, 3), lower=DAY, upper=2 * DAY)
    done = compact(shard, options=CompactOptions(schedule=ScheduleOptions()))
    assert done.applied == 1
    set_retention(shard, "1h")
    assert advance_since(shard).seqno == 5
    shard.evolve(SchemaChange(kind="add", name="extra", type="int64"))
    kinds = [c.kind for _, c in reversed(shard.log(limit=100))]
    assert kinds == ["create", "append", "append", "compact", "retention", "since", "schema"]
    return shard


def test_no_maintenance_or_schema_commit_produces_a_seal(shard_url: str) -> None:
    shard = _maintained(shard_url)
    for _, c in shard.log(limit=100):
        assert (c.sealed() is not None) == (c.kind in SEALING), c
    got = [(s.lower, s.upper, s.seqno) for s in seals(shard)]
    assert got == [(MIN_TIME, 0, 0), (0, DAY, 1), (DAY, 2 * DAY, 2)]


def test_a_late_file_stays_late_after_maintenance(shard_url: str) -> None:
    """The file landed after day 1 was sealed (seqno 1) and before every maintenance commit:
    whatever maintenance did since, its day-1 rows are late and the whole file is refused."""
    shard = _maintained(shard_url)
    landed = (_at(shard, 1) + _at(shard, 3)) / 2
    t = pa.table({"user": ["late", "late"], TIME: [DAY // 2, 2 * DAY + 5]})
    with pytest.raises(LateDataError) as e:
        check_late(t, LandingFile("late.parquet", 1, landed), lower=2 * DAY, seals=seals(shard), root="r")
    assert "late file r/late.parquet" in str(e.value) and "commit seqno 1" in str(e.value)


def test_a_truncated_history_falls_back_to_sealing_commits_only(shard_url: str) -> None:
    """The window holds only maintenance commits and no append: the horizon seal stands for the
    commits before it (all times below the oldest retained upper were sealed by then), never a
    maintenance commit's numbers."""
    shard = _maintained(shard_url)
    window = seals(shard, limit=4)  # seqnos 3..6: compact, retention, since, schema
    assert [(s.lower, s.upper, s.seqno) for s in window] == [(MIN_TIME, 2 * DAY, 3)]
    t = pa.table({"user": ["late"], TIME: [DAY // 2]})
    landed = _at(shard, 3) + 0.001
    with pytest.raises(LateDataError, match="commit seqno 3"):
        check_late(t, LandingFile("late.csv", 1, landed), lower=2 * DAY, seals=window, root="r")
    check_late(t, LandingFile("old.csv", 1, _at(shard, 3) - 1), lower=2 * DAY, seals=window, root="r")
    closed = Shard.open(shard_url)
    closed.close(expected_upper=2 * DAY)
    last = seals(closed, limit=1)
    assert [(s.lower, s.upper) for s in last] == [(MIN_TIME, END_OF_TIME), (2 * DAY, END_OF_TIME)]


def test_an_append_seals_its_times_as_of_the_listing_that_fixed_its_input(shard_url: str) -> None:
    """The listing travels on the commit record (stored, read back by a fresh handle): the seal is
    at the listing's time, not the commit's, and names what the listing held."""
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    listed = Listing(at=1_700_000_000.0, held=(("dt=0/a b.parquet", 1_700_000_000.0),))
    staged = shard.stage(rows(0, 3), lower=0, upper=DAY, desc_id="d0")
    shard.compare_and_append([staged], expected_upper=0, new_upper=DAY, desc_id="d0", listing=listed)
    got = seals(Shard.open(shard_url))
    assert [(s.lower, s.upper, s.seqno, s.at, s.held) for s in got[1:]] == [
        (0, DAY, 1, 1_700_000_000.0, frozenset({("dt=0/a b.parquet", 1_700_000_000.0)}))]
    assert got[0].at == _at(shard, 0), "a commit without a listing seals as of its own time"


@pytest.mark.parametrize(("listing", "needle"), [
    (Listing(at=float("nan")), "listing time nan"),
    (Listing(at=-1.0), "listing time -1.0"),
    (Listing(at=1e12), "listing time 1000000000000.0"),
    (Listing(at=10.0, held=(("", 10.0),)), "held input key ''"),
    (Listing(at=10.0, held=(("a", 9.0),)), "appeared at 9.0, not at or after"),
    (Listing(at=10.0, held=tuple((f"k{i}", 10.0) for i in range(10_001))), "holds 10001 inputs"),
    ({"at": 10.0}, "must be a shardsink.core.commits.Listing"),
])
def test_a_malformed_listing_is_refused_and_nothing_is_committed(shard_url: str, listing: object,
                                                                 needle: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    staged = shard.stage(rows(0, 3), lower=0, upper=DAY, desc_id="d0")
    with pytest.raises(InvalidUsageError, match=re.escape(needle)):
        shard.compare_and_append([staged], expected_upper=0, new_upper=DAY, desc_id="d0",
                                 listing=listing)  # type: ignore[arg-type]
    assert shard.info().upper == 0 and shard.info().seqno == 0


def test_seals_down_to_a_time_read_back_only_to_the_commit_that_sealed_it(tmp_path: Path) -> None:
    """A mint judging yesterday's files asks for the seals from yesterday on: the history is read
    back in small steps to the commit that sealed that time, whatever the shard's length, and
    the seals it returns are those of the full read for those times."""
    url = (tmp_path / "s").as_uri()
    Shard.create(url, SCHEMA, upper=0)
    for d in range(40):
        Shard(url).append(rows(d * DAY, 1), lower=d * DAY, upper=(d + 1) * DAY)
    blob = open_blob(url)
    shard = Shard(url, blob=blob)
    head = shard.reader().head()
    before = blob.requests
    near = seals(shard, head=head, down_to=38 * DAY + 5)
    assert blob.requests - before <= 10, "one step of versions, not the history"
    full = seals(shard, head=head)

    def from_(got: list[Seal], t: int) -> list[tuple[int, int, int, float]]:
        return [(s.lower, s.upper, s.seqno, s.at) for s in got if s.upper > t]

    assert from_(near, 38 * DAY + 5) == from_(full, 38 * DAY + 5) and len(from_(near, 38 * DAY + 5)) == 2
    deep = seals(shard, head=head, down_to=3 * DAY)  # several steps back, to the commit of day 3
    assert from_(deep, 3 * DAY) == from_(full, 3 * DAY) and len(from_(deep, 3 * DAY)) == 37
