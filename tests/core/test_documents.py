"""Stored documents are typed structs: old shards read, newer writers' extra fields are tolerated,
a newer format is refused with a clear error naming the object.

``tests/fixtures/shard-format1`` was written by shardsink before documents became msgspec
structs (40 appends with retractions, a rollup at 32, a staged-only description with its
manifest, a lease). It must keep reading, and keep accepting appends, forever.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shardsink import Shard
from shardsink.core import fate as ft
from shardsink.core import leases
from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core.commits import (
    AppendCommit,
    CloseCommit,
    CompactCommit,
    CreateCommit,
    RetentionCommit,
    SchemaCommit,
    SinceCommit,
)
from shardsink.errors import CorruptionError
from shardsink.sinks.description import Description
from shardsink.sinks.staging import read_manifests

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "shard-format1"


@pytest.fixture
def old_shard(tmp_path: Path) -> Shard:
    root = tmp_path / "old"
    shutil.copytree(FIXTURE, root)
    return Shard.open(root.as_uri())


def test_a_shard_written_before_typed_documents_still_reads_and_appends(old_shard: Shard) -> None:
    info = old_shard.info()
    assert (info.seqno, info.upper, info.since, info.rollup) == (40, 400, 0, 32)
    assert info.schema.names == ["k", "n"]
    assert info.last_commit.desc_id == "d39" and info.last_commit.writer == "fixture"
    # each append i inserts (k_i, i) and retracts (k_{i-1}, i-1): one row alive at any time
    assert old_shard.snapshot(399).to_pylist() == [{"k": "k39", "n": 39, "_count": 1}]
    assert old_shard.snapshot(5).to_pylist() == [{"k": "k0", "n": 0, "_count": 1}]
    assert old_shard.changes(0, 400).num_rows == 79
    assert [s for s, _ in old_shard.log(limit=3)] == [40, 39, 38]
    assert len(old_shard.batches()) == 40
    fate = old_shard.fate("d3", 30)
    assert isinstance(fate, ft.Committed) and fate.seqno == 4
    staged = read_manifests(old_shard, Description("staged-only", 400, 410, 1), 1)
    assert staged[0].rows == 1
    (lease,) = old_shard.leases()
    assert (lease.as_of, lease.holder, lease.format) == (395, "fixture", 1)
    r = old_shard.compare_and_append(staged, expected_upper=400, new_upper=410, desc_id="staged-only")
    assert r.status == "committed"
    again = Shard.open(old_shard.url)
    assert again.snapshot(409).num_rows == 2 and again.info().seqno == 41


def _with_extras(doc: Any) -> Any:
    """``doc`` with an unknown field added to every object in it (what a newer writer might add)."""
    if isinstance(doc, dict):
        return {**{k: _with_extras(v) for k, v in doc.items()}, "added_by_a_newer_writer": {"x": [1, 2]}}
    if isinstance(doc, list):
        return [_with_extras(v) for v in doc]
    return doc


def test_unknown_fields_at_every_level_are_ignored_by_readers(old_shard: Shard) -> None:
    blob = old_shard._machine.blob
    for key in ("state/v/00000000000000000005.json", "state/rollup/00000000000000000032.json"):
        got = blob.get(key)
        assert got is not None
        blob.put(key, json.dumps(_with_extras(json.loads(got.data))).encode())
    v5 = sc.decode_version(blob.get("state/v/00000000000000000005.json").data, where="v5")  # type: ignore[union-attr]
    assert v5.seqno == 5 and v5.added[0].desc_id == "d4" and v5.commit.kind == "append"
    (lease,) = old_shard.leases()
    key = lease.key
    got = blob.get(key)
    assert got is not None
    blob.put(key, json.dumps(_with_extras(json.loads(got.data))).encode())
    manifest = "staging/staged-only/slot-0.json"
    got = blob.get(manifest)
    assert got is not None
    blob.put(manifest, json.dumps(_with_extras(json.loads(got.data))).encode())

    fresh = Shard.open(old_shard.url)
    assert fresh.snapshot(399).num_rows == 1 and len(fresh.batches()) == 40
    assert [x.lease_id for x in fresh.leases()] == [lease.lease_id]
    assert read_manifests(fresh, Description("staged-only", 400, 410, 1), 1)[0].rows == 1


def test_a_newer_format_or_a_missing_field_is_refused_naming_the_object(old_shard: Shard) -> None:
    key = "state/v/00000000000000000007.json"
    got = old_shard._machine.blob.get(key)
    assert got is not None
    doc = json.loads(got.data)
    with pytest.raises(CorruptionError, match=r"v7: unsupported state version format 3 .*upgrade"):
        sc.decode_version(json.dumps({**doc, "format": 3}).encode(), where="v7")
    del doc["header"]["upper"]
    with pytest.raises(CorruptionError, match=r"v7: unreadable state version .*upper"):
        sc.decode_version(json.dumps(doc).encode(), where="v7")


def test_documents_are_canonical_sorted_json_and_round_trip() -> None:
    part = st.PartMeta("parts/d/a.parquet", 3, 100, 1, 2)
    batch = st.BatchMeta("d", 0, 10, 1, (part,))
    rollup = sc.encode_rollup(1, [batch])
    assert rollup == json.dumps(json.loads(rollup), sort_keys=True, separators=(",", ":")).encode()
    assert sc.decode_rollup(rollup, where="r") == (1, (batch,))
    lease = leases.Lease(lease_id="x", as_of=1, seqno=2, holder="h", acquired_at=1.5, expires_at=2.5)
    assert msgspec.json.decode(leases._encode(lease), type=leases.Lease) == lease


#: Format 1 stored one record shape for every kind: lower/upper meant the batch bounds, or the
#: old and new since, retention or schema id. Each decodes as its own kind's record.
FORMAT1_COMMITS = [
    ({"kind": "create", "desc_id": None, "lower": None, "upper": 5, "rows": 0},
     CreateCommit(at="t", writer="w", nonce="n", upper=5)),
    ({"kind": "append", "desc_id": "d", "lower": 0, "upper": 10, "rows": 3, "props": [["a", "b"]]},
     AppendCommit(at="t", writer="w", nonce="n", desc_id="d", lower=0, upper=10, rows=3, props=(("a", "b"),))),
    ({"kind": "close", "desc_id": "d", "lower": 10, "upper": None, "rows": 0},
     CloseCommit(at="t", writer="w", nonce="n", desc_id="d", lower=10, rows=0)),
    ({"kind": "compact", "desc_id": "compact-1", "lower": 0, "upper": 20, "rows": 4},
     CompactCommit(at="t", writer="w", nonce="n", compaction_id="compact-1", lower=0, upper=20, rows=4)),
    ({"kind": "since", "desc_id": None, "lower": 0, "upper": 15, "rows": 0},
     SinceCommit(at="t", writer="w", nonce="n", old=0, new=15)),
    ({"kind": "retention", "desc_id": None, "lower": None, "upper": 3600000, "rows": 0},
     RetentionCommit(at="t", writer="w", nonce="n", old=None, new=3600000)),
    ({"kind": "schema", "desc_id": None, "lower": 0, "upper": 1, "rows": 0, "props": [["change", "add x:int64"]]},
     SchemaCommit(at="t", writer="w", nonce="n", old_id=0, new_id=1, change="add x:int64")),
]


@pytest.mark.parametrize(("stored", "record"), FORMAT1_COMMITS, ids=[r.kind for _, r in FORMAT1_COMMITS])
def test_every_format_1_commit_decodes_as_its_kinds_record(old_shard: Shard, stored: dict[str, Any],
                                                           record: Any) -> None:
    got = old_shard._machine.blob.get("state/v/00000000000000000007.json")
    assert got is not None
    doc = {**json.loads(got.data), "commit": {**stored, "at": "t", "writer": "w", "nonce": "n"}}
    v = sc.decode_version(json.dumps(doc).encode(), where="v7")
    assert v.commit == record
    assert (v.commit.sealed() is not None) == (record.kind in ("create", "append", "close"))
    again = sc.decode_version(sc.encode_version(v), where="v7 re-encoded")
    assert again.commit == record and json.loads(sc.encode_version(v))["format"] == sc.FORMAT


def test_a_format_1_commit_of_an_unknown_kind_is_refused_naming_the_object(old_shard: Shard) -> None:
    got = old_shard._machine.blob.get("state/v/00000000000000000007.json")
    assert got is not None
    doc = json.loads(got.data)
    doc["commit"]["kind"] = "teleport"
    with pytest.raises(CorruptionError, match=r"v7: unknown commit kind 'teleport'"):
        sc.decode_version(json.dumps(doc).encode(), where="v7")
    doc["format"] = 2
    with pytest.raises(CorruptionError, match=r"v7: unreadable commit record"):
        sc.decode_version(json.dumps(doc).encode(), where="v7")
