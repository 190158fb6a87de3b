"""core/settle.py: one description's append is decided by its fate and carried out in core.

Each test drives ``Shard.settle`` on a local shard and checks what the call says against what is
in the store afterwards (the shard's upper, the part keys under the description's prefix)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core.fate import StillPossible
from shardsink.core.settle import Claim, NotYet, Refused, Staged
from shardsink.core.shard import AppendResult, StagedBatch
from shardsink.errors import CorruptionError
from shardsink_dev.synthetic import SCHEMA


def _rows(t: int) -> pa.Table:
    return pa.table({"user": ["u"], "action": ["buy"], "amount": [1], "_time": [t]})


def _stage(shard: Shard, desc_id: str, lower: int, upper: int) -> StagedBatch:
    return shard.stage(_rows(lower), lower=lower, upper=upper, desc_id=desc_id)


def _present(shard: Shard, desc_id: str) -> frozenset[str]:
    return shard.writer().list_staged(desc_id)


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    return Shard.create(f"file://{tmp_path}/s", SCHEMA, upper=0)


def test_a_claim_at_the_upper_commits_once_and_its_twin_reports_already_committed(shard: Shard) -> None:
    s = _stage(shard, "d1", 0, 10)
    calls: list[AppendResult] = []
    got = shard.settle(Claim(desc_id="d1", lower=0, upper=10, writer="w"), load=lambda: ([s], {}),
                       on_commit=calls.append)
    assert isinstance(got, AppendResult) and got.status == "committed" and calls == [got]
    again = shard.settle(Claim(desc_id="d1", lower=0, upper=10), load=lambda: pytest.fail("no load once committed"))
    assert isinstance(again, AppendResult) and again.status == "already_committed" and again.seqno == got.seqno
    assert shard.info().upper == 10 and _present(shard, "d1") == {p.key for p in s.parts}


def test_a_claim_the_upper_passed_is_refused_and_its_staged_parts_deleted(shard: Shard) -> None:
    shard.append(_rows(0), lower=0, upper=10, desc_id="winner")
    _stage(shard, "loser", 0, 10)
    got = shard.settle(Claim(desc_id="loser", lower=0, upper=10), load=lambda: pytest.fail("no load when lost"))
    assert isinstance(got, Refused) and got.current == 10 and got.deleted >= 1
    assert _present(shard, "loser") == frozenset()


def test_a_claim_ahead_of_the_upper_is_not_yet_and_nothing_is_read_or_deleted(shard: Shard) -> None:
    s = _stage(shard, "ahead", 10, 20)
    got = shard.settle(Claim(desc_id="ahead", lower=10, upper=20), load=lambda: pytest.fail("no load ahead"))
    assert got == NotYet("ahead", 0)
    assert _present(shard, "ahead") == {p.key for p in s.parts} and shard.info().upper == 0


def test_a_stale_decision_loses_to_a_rival_and_deletes_only_after_a_fresh_read(shard: Shard) -> None:
    """``decided`` says it may commit (from an older version); a rival commits first: the refused
    put re-decides from a fresh read before anything is deleted."""
    s = _stage(shard, "late", 0, 10)
    shard.append(_rows(0), lower=0, upper=10, desc_id="rival")
    got = shard.settle(Claim(desc_id="late", lower=0, upper=10), load=lambda: ([s], {}), decided=StillPossible(0))
    assert isinstance(got, Refused) and got.current == 10 and _present(shard, "late") == frozenset()


def test_manifests_gone_under_a_twin_that_committed_settle_as_already_committed(shard: Shard) -> None:
    """SUBTLE: load() fails because a twin committed and cleaned up meanwhile: the fresh fate read says so."""
    s = _stage(shard, "twin", 0, 10)
    stale = shard.fate("twin", 0)

    def load() -> Staged:
        shard.settle(Claim(desc_id="twin", lower=0, upper=10), load=lambda: ([s], {}))  # the twin, first
        raise CorruptionError("manifest staging/twin/slot-0.json is missing")

    got = shard.settle(Claim(desc_id="twin", lower=0, upper=10), load=load, decided=stale)
    assert isinstance(got, AppendResult) and got.status == "already_committed" and shard.info().upper == 10
