"""Evolving a real shard (local folder and S3) to hold real landing files before a batch is
written (schema_mode="add_columns"): committed once, idempotent under racing evolvers, refused
by name with nothing written, and appends staged under the older schema still commit."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from support.fake_source import FakeSource, rows

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.evolve import evolve_for_source, evolve_to
from shardsink.sinks.ingest import mint_chain
from shardsink.sinks.staging import write_manifest
from shardsink.sources import LandingSource
from shardsink.sources.evolution import SchemaMismatchError
from shardsink_dev.synthetic import SCHEMA, land_file, landing_table

DAY = 86_400_000


def _landing(tmp_path: Path, *extra: tuple[str, pa.Table]) -> LandingSource:
    root = str(tmp_path / "landing")
    land_file(root, "d1.parquet", landing_table(0, DAY, 4, seed=1))
    t = landing_table(DAY, 2 * DAY, 4, seed=2)
    land_file(root, "d2.parquet", t.append_column("country", pa.array(["nl", "de", None, "fr"])))
    for key, table in extra:
        land_file(root, key, table)
    return LandingSource(root)


def _objects(shard: Shard) -> dict[str, bytes]:
    out = {}
    for o in shard._machine.blob.list(""):
        got = shard._machine.blob.get(o.key)
        assert got is not None
        out[o.key] = got.data
    return out


def test_the_files_new_column_is_added_once_and_again_is_a_no_op(shard_url: str, tmp_path: Path) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    src = _landing(tmp_path)
    done = evolve_for_source(shard, src, writer="t")
    assert [c.describe() for c in done] == ["add country:string"]
    hist = shard.schema_history()
    assert [(e.id, [f.name for f in e.fields]) for e in hist] == [
        (0, ["user", "action", "amount"]), (1, ["user", "action", "amount", "country"])]
    seqno = shard.info().seqno
    assert evolve_for_source(shard, src, writer="t") == [] and shard.info().seqno == seqno


def test_racing_evolvers_add_the_column_once(shard_url: str, tmp_path: Path) -> None:
    """Two mints (threads, one barrier) evolve the same shard for the same files: both succeed,
    the column is added once; and an evolver working from a head a racer already moved past
    (the machine refuses its now-duplicate add) re-reads and finds nothing left to do."""
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    src = _landing(tmp_path)
    gate = threading.Barrier(2)
    got: list[list[SchemaChange] | BaseException] = []

    def mint() -> None:
        gate.wait()
        try:
            got.append(evolve_for_source(Shard(shard_url), src, writer="t"))
        except BaseException as e:  # reported by the assertion below
            got.append(e)

    threads = [threading.Thread(target=mint) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(g, list) for g in got), got
    assert sorted(len(g) for g in got if isinstance(g, list)) == [0, 1]
    assert len(shard.schema_history()) == 2

    stale = shard.reader().head().header  # schema 1 holds country: a racer widens it past a stale reader
    shard.evolve(SchemaChange(kind="widen", name="country", type="large_string"), writer="racer")
    assert evolve_for_source(shard, src, writer="t", header=stale) == []  # the wider column holds the files
    assert [e.id for e in shard.schema_history()] == [0, 1, 2]


def test_a_racer_that_made_the_column_something_else_is_refused(shard_url: str, tmp_path: Path) -> None:
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    src = _landing(tmp_path)
    stale = shard.reader().head().header
    shard.evolve(SchemaChange(kind="add", name="country", type="int64"), writer="racer")
    before = _objects(shard)
    with pytest.raises(SchemaMismatchError, match=r"column 'country' as string, but the shard's is int64") as e:
        evolve_for_source(shard, src, writer="t", header=stale)  # planned on the stale head, refused on the fresh
    assert e.value.value == "country"
    assert _objects(shard) == before


def test_several_changes_commit_as_one_schema_id_and_again_change_nothing(shard_url: str) -> None:
    shard = Shard.create(shard_url, pa.schema([("user", pa.string()), ("n", pa.int32())]), upper=0)
    target = pa.schema([("user", pa.string()), ("n", pa.int64()), ("a", pa.float64()), ("b", pa.string())])
    done = evolve_to(shard, target, writer="t")
    assert [c.describe() for c in done] == ["add a:double", "add b:string", "widen n:int64"]
    assert [e.id for e in shard.schema_history()] == [0, 1] and shard.schema == target
    assert [getattr(c, "change", None) for _, c in shard.log(limit=1)] == ["add a:double, add b:string, widen n:int64"]
    assert [f.id for f in shard.schema_history()[1].fields] == [1, 2, 3, 4]
    assert evolve_to(shard, target, writer="t") == [] and len(shard.log(limit=5)) == 2


def test_a_bad_file_fails_before_anything_is_written(shard_url: str, tmp_path: Path) -> None:
    """d2 would add a column, bad.parquet cannot be held: neither is written (no half evolution)."""
    bad = landing_table(0, DAY, 2, seed=3).set_column(2, "amount", pa.array(["1", "2"]))
    src = _landing(tmp_path, ("bad.parquet", bad))
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    before = _objects(shard)
    with pytest.raises(SchemaMismatchError) as e:
        evolve_for_source(shard, src, writer="t")
    assert f"{src.root}/bad.parquet: column 'amount' has type string; the shard's is int64" in str(e.value)
    assert e.value.value == "amount"
    assert _objects(shard) == before


def test_an_append_staged_under_the_older_schema_still_commits(shard_url: str, tmp_path: Path) -> None:
    """Day 1 staged under schema 0, the shard evolved before its append: it commits, read through
    its own schema id (nulls in the new column); day 2 staged under schema 1 keeps its values."""
    shard = Shard.create(shard_url, SCHEMA, upper=0)
    d1 = mint_chain(shard, FakeSource(DAY), interval_end=None, max_span=None, max_chain=1, dag_id="d", run_id="r1",
                    attempt=1)
    assert isinstance(d1, list) and isinstance(d1[0], Description)
    staged = shard.stage(rows(0, 3), lower=0, upper=DAY, desc_id=d1[0].desc_id)
    write_manifest(shard, d1[0], slot=0, slots=1, parts=staged.parts, schema_id=0)
    evolve_for_source(shard, _landing(tmp_path), writer="t")
    assert append_from_manifests(shard, d1[0], 1).status == "committed"
    d2 = Description("d2", DAY, 2 * DAY, 1)
    new = rows(DAY, 2).append_column("country", pa.array(["nl", "de"])).select(
        ["user", "action", "amount", "country", "_time"])
    staged = shard.stage(new, lower=DAY, upper=2 * DAY, desc_id="d2")
    write_manifest(shard, d2, slot=0, slots=1, parts=staged.parts, schema_id=1)
    assert append_from_manifests(shard, d2, 1).status == "committed"
    assert [b.schema_id for b in shard.batches()] == [0, 1]
    snap = shard.snapshot(2 * DAY - 1).sort_by("user")
    assert snap["country"].to_pylist() == [None, None, None, "nl", "de"]
