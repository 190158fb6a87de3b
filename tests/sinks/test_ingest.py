"""The ingest sink's library steps without Airflow or Spark: mint, manifests, append, cleanup."""

from __future__ import annotations

import pytest
from support.fake_source import FakeSource, rows
from support.inject.faultpoints import install

from shardsink import Shard
from shardsink.core.shard import StagedBatch
from shardsink.errors import CorruptionError, UnknownOutcomeError
from shardsink.sinks.append import LostRaceError, append_from_manifests
from shardsink.sinks.description import Description, NoOp, make_desc_id
from shardsink.sinks.ingest import committed, mint_chain
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink_dev.synthetic import SCHEMA, publish_watermark

DAY = 86_400_000


def stage_slot(shard: Shard, d: Description, slot: int, slots: int, n: int = 3) -> StagedBatch:
    s = shard.stage(rows(d.lower + 10 * slot, n), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
    write_manifest(shard, d, slot=slot, slots=slots, parts=s.parts)
    return s


def desc(shard: Shard, wm: int, attempt: int = 1, span: int | None = None) -> Description:
    out = mint_chain(shard, FakeSource(wm), interval_end=None, max_span=span, max_chain=1, dag_id="d", run_id="r",
                     attempt=attempt)
    assert isinstance(out, list) and isinstance(out[0], Description)
    return out[0]


def test_mint_bounds_and_no_op_reasons(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=1000)
    one = {"max_chain": 1, "dag_id": "d", "run_id": "r", "attempt": 1}
    d = mint_chain(shard, FakeSource(5000), interval_end=4000, max_span=2500, **one)
    assert isinstance(d, list) and [(x.lower, x.upper) for x in d] == [(1000, 3500)]
    d = mint_chain(shard, FakeSource(5000), interval_end=2000, max_span=None, **one)
    assert isinstance(d, list) and [(x.lower, x.upper) for x in d] == [(1000, 2000)]
    noop = mint_chain(shard, FakeSource(900), interval_end=4000, max_span=None, **one)
    assert isinstance(noop, NoOp)
    assert "shard upper 1000, watermark 900, interval end 4000" in noop.reason
    noop = mint_chain(shard, FakeSource(None), interval_end=4000, max_span=None, **one)
    assert isinstance(noop, NoOp) and "no watermark" in noop.reason


def test_desc_ids_are_unique_and_valid() -> None:
    ids = {make_desc_id("my dag", "manual__2024-01-01T00:00:00+00:00", 2) for _ in range(50)}
    assert len(ids) == 50
    for i in ids:
        assert i.startswith("my-dag-manual__2024-01-01T00-00-00+00-00-a2-") and len(i) <= 128


def test_append_commits_all_slots_and_deletes_leftovers(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = desc(shard, DAY)
    stage_slot(shard, d, 0, 2)
    leftover = shard.stage(rows(0, 2), lower=0, upper=DAY, desc_id=d.desc_id)  # a killed write attempt
    stage_slot(shard, d, 1, 2)
    r = append_from_manifests(shard, d, 2)
    assert r.status == "committed" and r.rows == 6 and shard.info().upper == DAY
    present = {o.key for o in shard._machine.blob.list("parts/")}
    assert not present & {p.key for p in leftover.parts}
    assert present == {p.key for b in shard.batches() for p in b.parts}
    assert not list(shard._machine.blob.list("staging/"))
    # the task retried after a lost answer: already committed, no manifests needed
    again = append_from_manifests(shard, d, 2)
    assert again.status == "already_committed" and again.seqno == r.seqno and again.rows == 6
    assert shard.snapshot()["_count"].to_pylist() == [1] * 6


def test_lost_race_deletes_everything_the_description_staged(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    mine, theirs = desc(shard, DAY), desc(shard, DAY)
    stage_slot(shard, mine, 0, 1)
    stage_slot(shard, theirs, 0, 1)
    assert append_from_manifests(shard, theirs, 1).status == "committed"
    with pytest.raises(LostRaceError) as e:
        append_from_manifests(shard, mine, 1)
    assert e.value.current == DAY and e.value.deleted == 2 and mine.desc_id in str(e.value)
    blob = shard._machine.blob
    assert not list(blob.list(f"parts/{mine.desc_id}/")) and not list(blob.list("staging/"))
    assert committed(shard, mine) is None and committed(shard, theirs) is not None
    # An operator re-runs only the failed append: its manifests are gone, but the verdict
    # is still "lost the race" (clear the whole run), not a misleading missing manifest.
    with pytest.raises(LostRaceError, match="clear the whole DAG run"):
        append_from_manifests(shard, mine, 1)
    assert shard.info().seqno == 1


def test_missing_manifest_is_refused_naming_the_slot(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = desc(shard, DAY)
    stage_slot(shard, d, 0, 2)
    with pytest.raises(CorruptionError, match=r"slot 1: manifest staging/.*/slot-1\.json is missing"):
        append_from_manifests(shard, d, 2)
    assert shard.info().seqno == 0


def test_lost_ack_then_retry_is_already_committed(shard_url: str, tmp_path: object) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = desc(shard, DAY)
    stage_slot(shard, d, 0, 1)
    remove = install({"append_ack_lost": {"once": f"{tmp_path}/m"}})
    try:
        with pytest.raises(UnknownOutcomeError, match="injected fault"):
            append_from_manifests(shard, d, 1)
        r = append_from_manifests(shard, d, 1)
    finally:
        remove()
    assert r.status == "already_committed" and r.rows == 3 and shard.info().seqno == 1


def test_seals_record_when_times_were_sealed(shard_url: str, tmp_path: object) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=100)
    d = desc(shard, 300)
    stage_slot(shard, d, 0, 1)
    append_from_manifests(shard, d, 1)
    s = seals(shard)
    assert [(x.lower, x.upper, x.seqno) for x in s] == [(-(2**63), 100, 0), (100, 300, 1)]
    assert s[0].at <= s[1].at
    publish_watermark(str(tmp_path), 1)  # (the helper works on a plain folder too)
