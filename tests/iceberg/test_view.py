"""The Iceberg view of a shard: turned on by a shard option, kept by the committing process,
read by pyiceberg and Polars exactly as shardsink reads the same version."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

from shardsink import iceberg
from shardsink.core import transitions as tr
from shardsink.core.commands import OptionCommand
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.iceberg import layout
from shardsink.maintenance.compact import compact_batches
from tests.iceberg.judge import iceberg_at, io_props, manifest_files, shard_at

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def rows(lo: int, n: int, *, t: int) -> pa.Table:
    return pa.table({"k": [f"k{i}" for i in range(lo, lo + n)], "v": list(range(lo, lo + n)),
                     "_time": [t] * n, "_diff": [1] * n})


def judge_every_snapshot(shard: Shard) -> int:
    """Every retained snapshot reads, through pyiceberg and Polars, as the shard's version; returns how many."""
    loc = iceberg.current_location(shard)
    meta = StaticTable.from_metadata(loc, properties=io_props(shard.url)).metadata
    for snap in meta.snapshots:
        seqno = layout.seqno_of_snapshot(snap.snapshot_id)
        v = shard.reader().version(seqno)
        assert v is not None
        cols, want = shard_at(shard, v)
        got_cols, got, frame = iceberg_at(loc, snap.snapshot_id, shard.url)
        assert got_cols == cols and got == want and frame == want, seqno
        live = {layout.location(shard.url, p.key) for b in shard.reader().batches(v) for p in b.parts}
        assert manifest_files(loc, snap.snapshot_id, shard.url) == live
    return len(meta.snapshots)


def test_option_is_recorded_in_the_shard_and_refused_when_malformed(tmp_path: object) -> None:
    shard = Shard.create(f"file://{tmp_path}/s", SCHEMA)
    admin = shard.admin()
    v = admin.commit(OptionCommand("iceberg", "on"))
    assert isinstance(v, tr.Version) and v.header.option("iceberg") == "on"
    assert shard.reader().head().header.options == (("iceberg", "on"),)
    assert "option iceberg" in shard.log(limit=1)[0][1].describe()
    assert isinstance(admin.commit(OptionCommand("iceberg", "on")), tr.Unchanged)
    seqno = shard.reader().head().seqno
    for name, value in (("Bad Name", "on"), ("iceberg", "x" * 300)):
        with pytest.raises(InvalidUsageError):
            admin.commit(OptionCommand(name, value))
    assert shard.reader().head().seqno == seqno
    off = admin.commit(OptionCommand("iceberg", None))
    assert isinstance(off, tr.Version) and off.header.options == ()


def test_appends_compaction_and_time_travel(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    shard.append(rows(0, 3, t=1), lower=0, upper=10)
    assert iceberg.enable(shard) == 2
    shard.append(rows(3, 2, t=12), lower=10, upper=20)
    shard.append(rows(0, 1, t=25).set_column(3, "_diff", pa.array([-1])), lower=20, upper=30)
    merged = compact_batches(shard, shard.batches()[:2], since=0)
    assert merged.status == "applied"
    loc = iceberg.current_location(shard)
    assert loc == layout.location(shard.url, layout.metadata_key(shard.reader().head().seqno))
    assert judge_every_snapshot(shard) == 4
    ops = [s.summary.operation.value for s in StaticTable.from_metadata(loc, properties=io_props(shard.url)
                                                                          ).metadata.snapshots]
    assert ops == ["append", "append", "append", "overwrite"]
    table = StaticTable.from_metadata(loc, properties=io_props(shard.url))
    assert table.properties["shardsink.shard"] == shard.url
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary["shardsink.seqno"] == str(shard.reader().head().seqno)
    snap = iceberg.snapshot_as_of(shard, 15)
    assert snap is not None and snap.upper() == 20


def test_unmappable_type_is_refused_and_nothing_written(tmp_path: object) -> None:
    shard = Shard.create(f"file://{tmp_path}/s", pa.schema([("k", pa.string()), ("u", pa.uint64())]))
    with pytest.raises(InvalidUsageError, match=r"'u'.*uint64"):
        iceberg.enable(shard)
    assert shard.reader().head().seqno == 0 and iceberg.find(shard) is None


def test_parts_carry_the_shard_schemas_field_ids(tmp_path: object) -> None:
    import pyarrow.parquet as pq

    from shardsink.core.schema import DIFF_FIELD_ID, TIME_FIELD_ID, SchemaChange

    shard = Shard.create(f"file://{tmp_path}/s", SCHEMA)
    shard.evolve(SchemaChange(kind="drop", name="v"))
    shard.evolve(SchemaChange(kind="add", name="v", type="int64"))  # the same name, a new field id
    shard.append(rows(0, 2, t=1), lower=0, upper=10)
    iceberg.enable(shard)
    (part,) = shard.batches()[0].parts
    ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in pq.read_schema(f"{tmp_path}/s/{part.key}")}
    assert ids == {"k": 1, "v": 3, "_time": TIME_FIELD_ID, "_diff": DIFF_FIELD_ID}
    assert judge_every_snapshot(shard) == 1  # read by id: the new v, not the dropped one's name mapping


def test_a_part_writer_spec_for_executors_carries_the_field_ids(tmp_path: object) -> None:
    import pyarrow.parquet as pq

    shard = Shard.create(f"file://{tmp_path}/s", SCHEMA)
    spec = shard.writer().part_writer("d1", schema=SCHEMA)
    assert dict(spec.options.field_ids)["v"] == 2
    parts = spec.open().stage(rows(0, 2, t=1), ["k", "v", "_time"])
    schema = pq.read_schema(f"{tmp_path}/s/{parts[0].key}")
    assert int(schema.field("k").metadata[b"PARQUET:field_id"]) == 1
    assert shard.writer().part_writer("d2").options.field_ids == ()  # no schema named: none written


def test_compaction_outputs_carry_the_field_ids(tmp_path: object) -> None:
    import pyarrow.parquet as pq

    shard = Shard.create(f"file://{tmp_path}/s", SCHEMA)
    shard.append(rows(0, 2, t=1), lower=0, upper=10)
    shard.append(rows(2, 2, t=11), lower=10, upper=20)
    assert compact_batches(shard, shard.batches(), since=0).status == "applied"
    (part,) = shard.batches()[0].parts
    schema = pq.read_schema(f"{tmp_path}/s/{part.key}")
    assert {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema}["v"] == 2
