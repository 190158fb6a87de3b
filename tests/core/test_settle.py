"""core/settle.py: one description's append is decided by its fate and carried out in core.

Each test drives ``Shard.settle`` on a local shard and checks what the call says against what is
in the store afterwards (the shard's upper, the part keys under the description's prefix). A
description that must not be loaded publishes no manifest: loading it would fail as corruption."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import Shard, hooks
from shardsink.core.fate import StillPossible
from shardsink.core.manifests import MANIFEST_FORMAT, ManifestDoc
from shardsink.core.settle import Claim, NotYet, Refused
from shardsink.core.shard import AppendResult, StagedBatch
from shardsink.errors import CorruptionError
from shardsink_dev.synthetic import SCHEMA


def _rows(t: int) -> pa.Table:
    return pa.table({"user": ["u"], "action": ["buy"], "amount": [1], "_time": [t]})


def _stage(shard: Shard, desc_id: str, lower: int, upper: int) -> StagedBatch:
    return shard.stage(_rows(lower), lower=lower, upper=upper, desc_id=desc_id)


def _published(shard: Shard, desc_id: str, lower: int, upper: int) -> StagedBatch:
    """Staged as a one-slot description, its manifest published (what a write task leaves)."""
    s = _stage(shard, desc_id, lower, upper)
    shard.writer().put_manifest(ManifestDoc(format=MANIFEST_FORMAT, desc_id=desc_id, lower=lower, upper=upper,
                                            attempt=1, slot=0, slots=1, rows=s.rows, parts=s.parts,
                                            schema_id=s.schema_id))
    return s


def _present(shard: Shard, desc_id: str) -> frozenset[str]:
    return shard.writer().list_staged(desc_id)


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    return Shard.create(f"file://{tmp_path}/s", SCHEMA, upper=0)


def test_a_claim_at_the_upper_commits_once_and_its_twin_reports_already_committed(shard: Shard) -> None:
    s = _published(shard, "d1", 0, 10)
    fired: list[str] = []
    removers = [hooks.register(p, lambda p=p, **kw: fired.append(f"{p} {kw['desc_id']} {kw['attempt']}"))
                for p in ("append.before_commit", "append.committed")]
    try:
        got = shard.settle(Claim(desc_id="d1", lower=0, upper=10, writer="w", attempt=3))
    finally:
        for remove in removers:
            remove()
    assert isinstance(got, AppendResult) and got.status == "committed" and got.rows == s.rows
    assert fired == ["append.before_commit d1 3", "append.committed d1 3"]
    again = shard.settle(Claim(desc_id="d1", lower=0, upper=10))  # its manifest is gone: no load
    assert isinstance(again, AppendResult) and again.status == "already_committed" and again.seqno == got.seqno
    assert shard.info().upper == 10 and _present(shard, "d1") == {p.key for p in s.parts}


def test_a_claim_the_upper_passed_is_refused_and_its_staged_parts_deleted(shard: Shard) -> None:
    shard.append(_rows(0), lower=0, upper=10, desc_id="winner")
    _stage(shard, "loser", 0, 10)
    got = shard.settle(Claim(desc_id="loser", lower=0, upper=10))
    assert isinstance(got, Refused) and got.current == 10 and got.deleted >= 1
    assert _present(shard, "loser") == frozenset()


def test_a_claim_ahead_of_the_upper_is_not_yet_and_nothing_is_read_or_deleted(shard: Shard) -> None:
    s = _stage(shard, "ahead", 10, 20)
    got = shard.settle(Claim(desc_id="ahead", lower=10, upper=20))
    assert got == NotYet("ahead", 0)
    assert _present(shard, "ahead") == {p.key for p in s.parts} and shard.info().upper == 0


def test_a_stale_decision_loses_to_a_rival_and_deletes_only_after_a_fresh_read(shard: Shard) -> None:
    """``decided`` says it may commit (from an older version); a rival commits first: the refused
    put re-decides from a fresh read before anything is deleted."""
    _published(shard, "late", 0, 10)
    shard.append(_rows(0), lower=0, upper=10, desc_id="rival")
    got = shard.settle(Claim(desc_id="late", lower=0, upper=10), decided=StillPossible(0))
    assert isinstance(got, Refused) and got.current == 10 and _present(shard, "late") == frozenset()


def test_a_slot_whose_manifest_is_missing_is_corruption_and_nothing_is_committed_or_deleted(shard: Shard) -> None:
    s = _published(shard, "two", 0, 10)
    with pytest.raises(CorruptionError, match=r"slot 1: manifest .*slot-1.json is missing"):
        shard.settle(Claim(desc_id="two", lower=0, upper=10, slots=2))
    assert shard.info().upper == 0 and _present(shard, "two") == {p.key for p in s.parts}


def test_manifests_gone_under_a_twin_that_committed_settle_as_already_committed(shard: Shard) -> None:
    """SUBTLE: the manifests are gone because a twin committed and cleaned up after our fate was
    decided: loading them fails, and the fresh fate read says the twin committed it."""
    _published(shard, "twin", 0, 10)
    stale = shard.fate("twin", 0)
    first = shard.settle(Claim(desc_id="twin", lower=0, upper=10))  # the twin, first: it deletes the manifest
    got = shard.settle(Claim(desc_id="twin", lower=0, upper=10), decided=stale)
    assert isinstance(first, AppendResult) and first.status == "committed"
    assert isinstance(got, AppendResult) and got.status == "already_committed" and shard.info().upper == 10
