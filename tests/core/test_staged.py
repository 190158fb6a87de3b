"""core/staged.py: what an append commits is what its slots' manifests name, verified against the
store; every problem is named, and nothing is committed or deleted because of it.

Each test stages real parts on a local shard, publishes manifests as a write slot would, and then
breaks one thing (the schema-id rules for older writers' manifests: tests/sinks/test_staging.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core.manifests import MANIFEST_FORMAT, ManifestDoc
from shardsink.core.staged import load_staged, verified_manifests
from shardsink.core.write import StagedBatch
from shardsink.errors import CorruptionError
from shardsink_dev.synthetic import SCHEMA


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    return Shard.create(f"file://{tmp_path}/s", SCHEMA, upper=0)


def _slot(shard: Shard, desc_id: str, slot: int, slots: int, *, props: dict[str, str] | None = None,
          change: dict[str, object] | None = None) -> StagedBatch:
    """Slot ``slot`` of ``slots`` of ``[0, 10)``: one row staged, its manifest published (``change``:
    fields of the manifest to falsify)."""
    t = pa.table({"user": [f"u{slot}"], "action": ["buy"], "amount": [slot], "_time": [slot]})
    s = shard.stage(t, lower=0, upper=10, desc_id=desc_id)
    doc = ManifestDoc(format=MANIFEST_FORMAT, desc_id=desc_id, lower=0, upper=10, attempt=1, slot=slot, slots=slots,
                      rows=s.rows, parts=s.parts, props=props or {}, schema_id=s.schema_id)
    shard.writer().put_manifest(msgspec.structs.replace(doc, **(change or {})))
    return s


def test_the_slots_manifests_load_as_their_staged_batches_with_the_props_they_agree_on(shard: Shard) -> None:
    a, b = _slot(shard, "d", 0, 2, props={"k": "v"}), _slot(shard, "d", 1, 2, props={"k": "v"})
    staged, props = load_staged(shard.writer(), shard.reader(), desc_id="d", lower=0, upper=10, slots=2)
    assert [s.parts for s in staged] == [a.parts, b.parts] and props == {"k": "v"}
    assert all(s.schema_id == 0 and (s.lower, s.upper) == (0, 10) for s in staged)
    _slot(shard, "e", 0, 2, props={"k": "v"})
    _slot(shard, "e", 1, 2, props={"k": "w"})
    assert load_staged(shard.writer(), shard.reader(), desc_id="e", lower=0, upper=10, slots=2)[1] == {}


@pytest.mark.parametrize(("change", "problem"), [
    ({"lower": 5}, r"slot 1: manifest staging/d/slot-1.json describes another batch or slot layout"),
    ({"slots": 3}, r"slot 1: manifest staging/d/slot-1.json describes another batch or slot layout"),
    ({"parts": "foreign"}, r"slot 1: parts outside the description \['parts/other/"),
    ({"parts": "gone"}, r"slot 1: parts outside the description \[\] or missing \['parts/d/"),
])
def test_a_manifest_that_does_not_match_the_store_is_corruption_naming_its_slot(
        shard: Shard, change: dict[str, object], problem: str) -> None:
    _slot(shard, "d", 0, 2)
    if change.get("parts") == "foreign":
        change = {"parts": shard.stage(pa.table({"user": ["x"], "action": ["a"], "amount": [1], "_time": [1]}),
                                       lower=0, upper=10, desc_id="other").parts}
    elif change.get("parts") == "gone":
        staged = _slot(shard, "d", 1, 2)
        change = {"parts": (msgspec.structs.replace(staged.parts[0], key=staged.parts[0].key + ".gone"),)}
    _slot(shard, "d", 1, 2, change=change)
    with pytest.raises(CorruptionError, match=problem):
        verified_manifests(shard.writer(), desc_id="d", lower=0, upper=10, slots=2)
    assert shard.info().upper == 0


def test_an_unreadable_manifest_and_a_missing_one_are_both_named(shard: Shard) -> None:
    _slot(shard, "d", 0, 3)
    shard.writer().put_manifest(ManifestDoc(format=MANIFEST_FORMAT, desc_id="d", lower=0, upper=10, attempt=1,
                                            slot=1, slots=3, rows=0, parts=()))
    Path(shard.url.removeprefix("file://"), "staging/d/slot-1.json").write_bytes(b"{not json")
    with pytest.raises(CorruptionError, match=r"slot 1: manifest .*; slot 2: manifest staging/d/slot-2.json is "
                                              r"missing \(its write task did not finish\)"):
        verified_manifests(shard.writer(), desc_id="d", lower=0, upper=10, slots=3)
