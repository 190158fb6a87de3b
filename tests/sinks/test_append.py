"""A run's append is one call with one typed outcome (sinks/append.py): Appended, Waiting, Lost or
Failed, decided from one fate read; deletions only through the fate primitive. The Airflow
mapping of each outcome (defer, skip, fail) is in tests/airflow/test_append_wait.py; twins and
killed appends in OS processes in tests/sinks/test_ahead_appends.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import SCHEMA, rows_for, table_of

from shardsink import Shard
from shardsink.core.fate import CannotCommit, StillPossible
from shardsink.errors import InvalidUsageError
from shardsink.sinks.append import Appended, Failed, Lost, Turn, Waiting, append_run
from shardsink.sinks.description import Description, make_desc_id
from shardsink.sinks.staging import write_manifest

WRITER = "airflow:d/backfill__2025-03-02"


def _stage(shard: Shard, d: Description) -> None:
    staged = shard.stage(table_of(rows_for(d.desc_id, d.lower, d.upper)), lower=d.lower, upper=d.upper,
                         desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=1, parts=staged.parts)


def _d(lower: int, upper: int, run: str = "backfill__2025-03-02") -> Description:
    return Description(make_desc_id("d", run, 1), lower, upper, 1)


def _turn(since: float, **kw: object) -> Turn:
    return Turn(since=since, max_wait=60, catch_up_after=30, dag_id="d", now=lambda: since + 1, **kw)  # type: ignore[arg-type]


def test_each_outcome_of_a_chain(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    earlier, ahead = _d(0, 10, "backfill__2025-03-01"), _d(10, 20)
    for d in (earlier, ahead):
        _stage(shard, d)
    # Minted ahead: Waiting, naming the description at the upper and its run; nothing touched.
    out = append_run(shard, [ahead], 1, writer=WRITER, turn=_turn(100.0))
    assert isinstance(out, Waiting) and out.upper == 0 and out.since == 100.0 and out.catch_up_after == 30
    assert f"{earlier.desc_id} [0, 10) of DAG run 'backfill__2025-03-01'" in out.behind
    assert isinstance(shard.fate(ahead.desc_id, ahead.lower), StillPossible)
    # Past max_wait: Failed for good, nothing deleted.
    out = append_run(shard, [ahead], 1, writer=WRITER, turn=_turn(100.0, timed_out=True))
    assert isinstance(out, Failed) and "max_append_wait 60s" in out.why and earlier.desc_id in out.why
    assert len(shard.admin().list_staged(ahead.desc_id)) == 2
    # Its turn: Appended, made by this writer; the next description in the chain follows.
    after = _d(20, 30)
    _stage(shard, after)
    assert append_run(shard, [earlier], 1, writer="airflow:d/other").landed[0].mine  # type: ignore[union-attr]
    out = append_run(shard, [ahead, after], 1, writer=WRITER)
    assert isinstance(out, Appended) and [x.result.status for x in out.landed] == ["committed", "committed"]
    assert all(x.mine for x in out.landed) and out.upper == 30 and not out.missed
    # Called again (a retried task, or the task after its trigger appended): its own, from the log.
    again = append_run(shard, [ahead, after], 1, writer=WRITER)
    assert isinstance(again, Appended) and [x.result.status for x in again.landed] == ["already_committed"] * 2
    assert all(x.mine for x in again.landed) and [x.at for x in again.landed] == [x.at for x in out.landed]
    other = append_run(shard, [ahead], 1, writer="airflow:d/manual__x")
    assert isinstance(other, Appended) and not other.landed[0].mine


def test_a_lost_chain_deletes_what_can_never_commit_and_a_given_up_turn_deletes_nothing(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    loser = _d(0, 10)
    _stage(shard, loser)
    shard.append(table_of(rows_for("racer", 0, 5)), lower=0, upper=5, desc_id="racer")
    out = append_run(shard, [loser], 1, writer=WRITER)
    assert isinstance(out, Lost) and not out.gave_up and out.upper == 5
    assert out.missed[0].deleted == 2 and "lost the race at shard upper 5" in out.why
    assert shard.fate(loser.desc_id, loser.lower) == CannotCommit(5)
    assert shard.admin().list_staged(loser.desc_id) == []
    # An idle wait with nobody at the upper gives its turn up: Lost, nothing deleted.
    ahead = _d(20, 30)
    _stage(shard, ahead)
    out = append_run(shard, [ahead], 1, writer=WRITER, turn=_turn(0.0, idle=True))
    assert isinstance(out, Lost) and out.gave_up and "gave its turn up" in out.why
    assert len(shard.admin().list_staged(ahead.desc_id)) == 2
    shard.close(expected_upper=5, desc_id="end")
    closing = _d(5, 10)
    _stage(shard, closing)
    out = append_run(shard, [closing], 1, writer=WRITER)  # the shard closed at its lower: it can never commit
    assert isinstance(out, Lost) and out.upper is None and shard.admin().list_staged(closing.desc_id) == []
    with pytest.raises(InvalidUsageError, match="at least one description"):
        append_run(shard, [], 1, writer=WRITER)
