"""Chains of descriptions to a run's target, and the re-processing helpers (no Airflow, no Spark)."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pytest
from test_ingest import FakeSource  # the same fake watermark source

from shardsink import Shard
from shardsink.core.part_io import write_parts
from shardsink.core.shard import StagedBatch
from shardsink.core.state import PartMeta, correction_label
from shardsink.errors import InvalidUsageError
from shardsink.maintenance.schedule import holds_corrections
from shardsink.sinks.description import Description, NoOp, to_builtins
from shardsink.sinks.ingest import mint_chain
from shardsink.sinks.reprocess import prior_corrections, requested_range
from shardsink.sinks.seals import seals
from shardsink_dev.synthetic import SCHEMA

DAY = 86_400_000


def _chain(shard: Shard, wm: int | None, end: int | None, *, span: int | None = DAY, cap: int = 16,
           corrects: tuple[int, int] | None = None) -> list[Description] | NoOp:
    return mint_chain(shard, FakeSource(wm), interval_end=end, max_span=span, max_chain=cap, dag_id="d",
                      run_id="r", attempt=1, corrects=corrects)


def test_chain_reaches_the_target_in_max_span_steps_and_is_capped(tmp_path: object) -> None:
    shard = Shard.create(f"{tmp_path}/s", SCHEMA, upper=0)
    got = _chain(shard, 10 * DAY, 4 * DAY)
    assert isinstance(got, list)
    assert [(d.lower, d.upper) for d in got] == [(i * DAY, (i + 1) * DAY) for i in range(4)]
    assert len({d.desc_id for d in got}) == 4 and all(d.corrects is None for d in got)
    half = _chain(shard, 10 * DAY, 4 * DAY, span=DAY // 2, cap=3)
    assert isinstance(half, list) and [(d.lower, d.upper) for d in half][-1] == (DAY, 3 * DAY // 2)
    assert [(d.lower, d.upper) for d in _chain(shard, DAY // 3, 4 * DAY)] == [(0, DAY // 3)]  # type: ignore[union-attr]


def test_covered_target_is_a_no_op_unless_a_correction_needs_a_time(tmp_path: object) -> None:
    shard = Shard.create(f"{tmp_path}/s", SCHEMA, upper=2 * DAY)
    assert isinstance(_chain(shard, 5 * DAY, 2 * DAY), NoOp)
    got = _chain(shard, 5 * DAY, DAY, corrects=(0, DAY))
    assert isinstance(got, list) and [(d.lower, d.upper, d.corrects) for d in got] == [(2 * DAY, 3 * DAY, (0, DAY))]
    wait = _chain(shard, 2 * DAY, DAY, corrects=(0, DAY))
    assert isinstance(wait, NoOp) and "watermark is not past the shard's upper" in wait.reason
    d = got[0]
    assert Description.decode(to_builtins(d)) == d


def test_requested_range_from_params() -> None:
    assert requested_range({}, interval=(0, DAY)) is None
    assert requested_range({"reprocess": True}, interval=(DAY, 2 * DAY)) == (DAY, 2 * DAY)
    assert requested_range({"reprocess_from": "1970-01-02", "reprocess_to": 2 * DAY}, interval=(0, 0)) == (
        DAY, 2 * DAY)
    with pytest.raises(InvalidUsageError, match="both reprocess_from and reprocess_to"):
        requested_range({"reprocess_from": "2024-01-01"}, interval=(0, DAY))
    with pytest.raises(InvalidUsageError, match="neither milliseconds nor an ISO"):
        requested_range({"reprocess_from": "yesterday", "reprocess_to": 5}, interval=(0, DAY))


def _commit_correction(shard: Shard, d: str, lower: int, upper: int, *, prefix: str,
                       corrects: tuple[int, int] | None) -> list[PartMeta]:
    """Commit description ``d`` [lower, upper) holding one correction part written under ``prefix``,
    recorded with ``corrects`` (None: as a writer before ``PartMeta.corrects`` recorded it), and
    an ordinary part; returns the correction part as a fresh handle reads it back."""
    t = pa.table({"user": ["a", "b"], "action": ["x", "x"], "amount": [1, 2], "_time": [upper - 1] * 2,
                  "_diff": [-1, 1]})
    part = [msgspec.structs.replace(p, corrects=corrects) for p in write_parts(shard._machine.blob, t, prefix=prefix)]
    plain = write_parts(shard._machine.blob, t, prefix=f"parts/{d}")
    shard.compare_and_append([StagedBatch(d, lower, upper, (*part, *plain))], expected_upper=lower,
                             new_upper=upper, desc_id=d)
    stored = {p.key: p for b in Shard(shard.url).batches() for p in b.parts}  # decoded from the store
    assert stored[plain[0].key].corrected_range() is None, "an ordinary part of a correcting batch corrects nothing"
    return [stored[p.key] for p in part]


def test_earlier_corrections_are_found_by_their_part_record_reseal_their_range_and_partial_overlaps_are_refused(
        tmp_path: object) -> None:
    """The range a correction part corrects is its record's ``corrects``, read back from the store:
    a part recorded with it is found whatever its key, and re-seals that range at its commit."""
    shard = Shard.create(f"{tmp_path}/s", SCHEMA, upper=0)
    shard.append(pa.table({"user": ["a"], "action": ["x"], "amount": [1], "_time": [5]}), lower=0, upper=3 * DAY)
    found = _commit_correction(shard, "corr-1", 3 * DAY, 4 * DAY, prefix="parts/corr-1/fix", corrects=(0, DAY))
    assert [p.corrects for p in found] == [(0, DAY)]
    assert [p.key for p in prior_corrections(shard, 0, 2 * DAY)] == [found[0].key]
    assert prior_corrections(shard, DAY, 2 * DAY) == []
    with pytest.raises(InvalidUsageError, match="partially overlaps the earlier correction"):
        prior_corrections(shard, DAY // 2, 2 * DAY)
    resealed = [s for s in seals(shard) if (s.lower, s.upper) == (0, DAY)]
    assert len(resealed) == 1 and resealed[0].seqno == 2


def test_a_correction_recorded_before_the_field_is_still_found_by_its_key_folder(tmp_path: object) -> None:
    """Parts committed by a writer older than ``PartMeta.corrects`` say what they correct only by
    their ``corrects-<A>_<B>/`` folder; they keep being found, re-sealing and kept out of merges."""
    shard = Shard.create(f"{tmp_path}/s", SCHEMA, upper=0)
    shard.append(pa.table({"user": ["a"], "action": ["x"], "amount": [1], "_time": [5]}), lower=0, upper=3 * DAY)
    old = _commit_correction(shard, "corr-1", 3 * DAY, 4 * DAY, prefix=f"parts/corr-1/{correction_label(0, DAY)}",
                             corrects=None)
    assert old[0].corrects is None and old[0].corrected_range() == (0, DAY)
    assert [p.key for p in prior_corrections(shard, 0, 2 * DAY)] == [old[0].key]
    assert [s.seqno for s in seals(shard) if (s.lower, s.upper) == (0, DAY)] == [2]
    assert [holds_corrections(b) for b in shard.batches()] == [False, True]
