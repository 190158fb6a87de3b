"""Staging manifests are typed documents: the bytes today's shardsink writes keep decoding,
unknown fields are ignored, a newer format or garbage is a CorruptionError naming the object.

The ``OLD_*`` bytes are exactly what shardsink wrote before the manifests became structs
(``json.dumps(..., sort_keys=True)``, produced by that code), or a file of the format-1
fixture shard.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from gc_helpers import SCHEMA, append_days, keys, rows

from shardsink import Shard
from shardsink.core import manifests as mf
from shardsink.core import state as st
from shardsink.errors import CorruptionError
from shardsink.maintenance.compact import _inputs_of, _manifest
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.sinks.description import Description
from shardsink.sinks.staging import MANIFEST_FORMAT, ManifestDoc, read_manifests

OLD_COMPACTION = (
    b'{"compaction_id": "compact-0f1e", "format": 1, "inputs": [{"desc_id": "d0", "lower": 0, "seqno": 1, '
    b'"upper": 10}, {"desc_id": "d1", "lower": 10, "seqno": 2, "upper": null}], "kind": "compaction", "since": 5}'
)
OLD_INGEST = (Path(__file__).resolve().parents[1] / "fixtures" / "shard-format1" / "staging" / "staged-only"
              / "slot-0.json").read_bytes()
WHERE = "s3://b/shard/staging/x/m.json"


def _plus(data: bytes, **extra: Any) -> bytes:
    return json.dumps({**json.loads(data), **extra}).encode()


def test_a_compaction_manifest_written_before_typed_documents_decodes_and_new_ones_round_trip() -> None:
    cid, inputs = _inputs_of(OLD_COMPACTION, WHERE)
    assert cid == "compact-0f1e"
    assert inputs == (st.BatchMeta("d0", 0, 10, 1, ()), st.BatchMeta("d1", 10, None, 2, ()))
    new = _manifest(cid, inputs, 5)
    # Same document, canonical form now (sorted keys, no spaces).
    assert json.loads(new) == json.loads(OLD_COMPACTION)
    assert new == json.dumps(json.loads(new), sort_keys=True, separators=(",", ":")).encode()
    assert _inputs_of(new, WHERE) == (cid, inputs)


def test_a_compaction_manifest_ignores_unknown_fields_and_refuses_newer_formats_and_garbage() -> None:
    doc = json.loads(OLD_COMPACTION)
    doc["inputs"][0]["added_by_a_newer_writer"] = [1]
    doc["priority"] = "high"
    assert _inputs_of(json.dumps(doc).encode(), WHERE)[1][0].desc_id == "d0"
    with pytest.raises(CorruptionError, match=r"staging/x/m\.json: unsupported compaction manifest format 2 .*upgrade"):
        _inputs_of(_plus(OLD_COMPACTION, format=2), WHERE)
    for bad in (b"not json {", b"[1, 2]", _plus(OLD_COMPACTION, inputs="d0"), _plus(OLD_COMPACTION, kind="ingest")):
        with pytest.raises(CorruptionError, match=r"staging/x/m\.json: unreadable compaction manifest"):
            _inputs_of(bad, WHERE)


def test_every_staging_manifest_has_a_typed_head_gc_reads() -> None:
    assert mf.decode_head(OLD_COMPACTION, where=WHERE) == mf.StagingHead(format=1, kind="compaction", lower=None)
    assert mf.decode_head(OLD_INGEST, where=WHERE) == mf.StagingHead(format=1, kind="ingest", lower=400)
    assert mf.decode_head(_plus(OLD_INGEST, kind="ingest", extra={"a": 1}), where=WHERE).lower == 400
    with pytest.raises(CorruptionError, match=r"staging/x/m\.json: unsupported staging manifest format 3 .*upgrade"):
        mf.decode_head(_plus(OLD_INGEST, format=3), where=WHERE)
    for bad in (b"\x00garbage", b'"a string"', _plus(OLD_INGEST, lower="400")):
        with pytest.raises(CorruptionError, match=r"staging/x/m\.json: unreadable staging manifest"):
            mf.decode_head(bad, where=WHERE)


def test_an_ingest_manifest_moved_to_core_still_reads_and_refuses_newer_formats_and_garbage(tmp_path: Path) -> None:
    assert (ManifestDoc, MANIFEST_FORMAT) == (mf.ManifestDoc, mf.MANIFEST_FORMAT)  # the names sinks.staging uses
    doc = mf.decode_manifest(OLD_INGEST, where=WHERE)
    assert (doc.desc_id, doc.lower, doc.upper, doc.rows, doc.writer) == ("staged-only", 400, 410, 1, "vm:7742")
    assert mf.decode_manifest(_plus(OLD_INGEST, added_by_a_newer_writer=1), where=WHERE) == doc
    shard = Shard.create((tmp_path / "s").as_uri(), pa.schema([("k", pa.string())]))
    key = "staging/staged-only/slot-0.json"
    desc = Description("staged-only", 400, 410, 1)
    for bad, why in ((_plus(OLD_INGEST, format=2), r"unsupported manifest format 2 .*upgrade"),
                     (b"garbage", r"unreadable manifest")):
        shard._machine.blob.put(key, bad)
        with pytest.raises(CorruptionError, match=rf"slot 0: manifest {key}: {why}"):
            read_manifests(shard, desc, 1)


def test_gc_leaves_a_description_alone_when_its_manifest_is_from_a_newer_shardsink(tmp_path: Path) -> None:
    """A format GC cannot read may mean rules it does not know (as compaction manifests did)."""
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    append_days(shard, 0, 3)
    staged = shard.stage(rows(0), lower=0, upper=10, desc_id="future-kind")  # would be CannotCommit by upper
    shard._machine.blob.put("staging/future-kind/slot-0.json", _plus(OLD_INGEST, format=2, kind="something-new"))
    report = collect(shard, GcOptions(grace_s=0, clock=lambda: time.time() + 60))  # everything is a minute old
    assert {p.key for p in staged.parts} <= keys(shard, "parts/")
    assert "staging/future-kind/slot-0.json" in keys(shard, "staging/")
    assert any("future-kind" in x and "upgrade" in x for x in report.skipped), report.skipped
