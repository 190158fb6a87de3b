"""Staging manifests carry the schema id their parts were written with (issue 19 §1): a schema
change landing between staging and append never mislabels the parts; a manifest of an older
writer (no schema id) is resolved only where no change can have landed since the mint."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.fake_source import FakeSource as _Source
from support.fake_source import rows as _rows

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.errors import InvalidUsageError
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import committed, mint_chain
from shardsink.sinks.staging import read_manifests, write_manifest
from shardsink_dev.synthetic import SCHEMA

DAY = 86_400_000


def _desc(shard: Shard, wm: int) -> Description:
    out = mint_chain(shard, _Source(wm), interval_end=None, max_span=None, max_chain=1, dag_id="d", run_id="r",
                     attempt=1)
    assert isinstance(out, list) and isinstance(out[0], Description)
    return out[0]


def _stage(shard: Shard, d: Description, *, record_id: bool = True) -> None:
    """What an ingest write slot does: stage with the head's schema, publish the manifest."""
    s = shard.stage(_rows(d.lower, 3), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=1, parts=s.parts, schema_id=s.schema_id if record_id else None)


def test_a_batch_staged_before_a_schema_change_appends_and_reads_under_the_new_schema(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = _desc(shard, DAY)
    _stage(shard, d)  # parts written with schema 0: user, action, amount
    shard.evolve(SchemaChange(kind="add", name="note", type="string"))
    shard.evolve(SchemaChange(kind="rename", name="action", new_name="verb"))
    assert [b.schema_id for b in read_manifests(shard, d, 1)] == [0]
    r = append_from_manifests(shard, d, 1)
    assert r.status == "committed" and r.rows == 3
    assert [b.schema_id for b in shard.batches()] == [0]
    snap = shard.snapshot().sort_by("user")
    assert snap.column_names == ["user", "verb", "amount", "note", "_count"]
    assert snap.to_pylist() == [{"user": f"u{i}", "verb": "x", "amount": i, "note": None, "_count": 1}
                                for i in range(3)]


def test_an_older_writers_manifest_on_a_shard_that_never_evolved_appends_as_schema_0(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = _desc(shard, DAY)
    _stage(shard, d, record_id=False)
    assert append_from_manifests(shard, d, 1).status == "committed"
    assert [b.schema_id for b in shard.batches()] == [0] and shard.snapshot().num_rows == 3


def test_an_older_writers_manifest_after_a_change_before_the_mint_takes_the_current_schema(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    shard.evolve(SchemaChange(kind="add", name="note", type="string"))  # at upper 0, before the shard reached DAY
    first = _desc(shard, DAY)
    s = shard.stage(_rows(0, 3).append_column("note", pa.nulls(3, pa.string())), lower=0, upper=DAY,
                    desc_id=first.desc_id)
    write_manifest(shard, first, slot=0, slots=1, parts=s.parts, schema_id=s.schema_id)
    append_from_manifests(shard, first, 1)
    d = _desc(shard, 2 * DAY)
    s = shard.stage(_rows(d.lower, 2).append_column("note", pa.array(["n", None])), lower=d.lower, upper=d.upper,
                    desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=1, parts=s.parts)  # an older writer: no schema id
    assert append_from_manifests(shard, d, 1).status == "committed"
    assert [b.schema_id for b in shard.batches()] == [1, 1]
    assert sorted(shard.snapshot()["note"].to_pylist(), key=str) == sorted([None] * 4 + ["n"], key=str)


def test_an_older_writers_manifest_after_a_change_at_the_descriptions_lower_is_refused(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = _desc(shard, DAY)
    _stage(shard, d, record_id=False)  # staged with schema 0, manifest says nothing
    shard.evolve(SchemaChange(kind="rename", name="action", new_name="verb"))
    before = shard.info().seqno
    with pytest.raises(InvalidUsageError, match=r"slot 0 records no schema id .* schema 1 was made current at upper 0"):
        append_from_manifests(shard, d, 1)
    assert shard.info().seqno == before and committed(shard, d) is None
    assert list(shard._machine.blob.list(f"parts/{d.desc_id}/")) and list(shard._machine.blob.list("staging/"))


@pytest.mark.parametrize("bad", [-1, 2**31, True, "0"])
def test_a_manifest_with_a_bad_schema_id_is_refused_and_not_written(shard_url: str, bad: object) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d = _desc(shard, DAY)
    s = shard.stage(_rows(0, 1), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
    with pytest.raises(InvalidUsageError, match="is not a schema id"):
        write_manifest(shard, d, slot=0, slots=1, parts=s.parts, schema_id=bad)  # type: ignore[arg-type]
    assert not list(shard._machine.blob.list("staging/"))
