"""Source files that change shape (schema_mode): what a shard must become to hold real landing
files, how files are read onto an evolved shard, and what is refused, naming the file and column."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from support.fake_source import FakeSource

from shardsink.core.updates import TIME
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import Description
from shardsink.sources import LandingSource, MalformedInputError
from shardsink.sources.evolution import SchemaMismatchError, changes_to, run_file_schemas, target_schema
from shardsink.sources.evolution import check_schema_mode as checked_schema_mode
from shardsink.sources.files import FileArrivals
from shardsink.sources.landing import read_landing_file
from shardsink.sources.stamp import stamp
from shardsink.spark.request import IngestWriteRequest, decode_request, encode_request
from shardsink.specs import spec_from_builtins
from shardsink_dev.synthetic import SCHEMA, land_file, landing_table

DAY = 86_400_000


def _day2(rows: int = 5, *, country: pa.Array | None = None) -> pa.Table:
    t = landing_table(DAY, 2 * DAY, rows, seed=2)
    return t.append_column("country", country if country is not None else pa.array(["nl"] * rows))


@pytest.fixture
def landing(tmp_path: Path) -> LandingSource:
    """Day 1 in Parquet and CSV (the shard's columns), day 2 in Parquet with a new column."""
    root = str(tmp_path / "landing")
    land_file(root, "d1/a.parquet", landing_table(0, DAY, 10, seed=1))
    land_file(root, "d1/b.csv", landing_table(0, DAY, 10, seed=3))
    land_file(root, "d2/a.parquet", _day2())
    return LandingSource(root)


def test_file_schemas_make_the_shard_add_the_new_nullable_column(landing: LandingSource) -> None:
    seen = dict(landing.file_schemas(SCHEMA))
    assert sorted(k.rsplit("/", 2)[-2] + "/" + k.rsplit("/", 1)[-1] for k in seen) == [
        "d1/a.parquet", "d1/b.csv", "d2/a.parquet"]
    assert all("event_time" not in s.names for s in seen.values())
    target = target_schema(SCHEMA, landing.file_schemas(SCHEMA))
    assert target.names == [*SCHEMA.names, "country"] and target.field("country").nullable
    assert [c.describe() for c in changes_to(SCHEMA, target, what="t")] == ["add country:string"]
    # Already held (a racing evolver made the same change): nothing left to do.
    assert changes_to(target, target, what="t") == []
    # A racer made the column something the files cannot be read into: refused naming it.
    clash = SCHEMA.append(pa.field("country", pa.int64()))
    with pytest.raises(SchemaMismatchError, match=r"t needs column 'country' as string, but the shard's is int64"):
        changes_to(clash, target, what="t")


def test_the_files_a_run_reads_come_through_one_protocol(landing: LandingSource, tmp_path: Path) -> None:
    """run_file_schemas: what the mint's evolution and a dry run read (a landing source from the
    shard's index, read-only); file_schemas_of refuses a source that cannot tell, naming it."""
    direct = target_schema(SCHEMA, landing.file_schemas(SCHEMA))
    shard = (tmp_path / "shard").as_uri()
    assert target_schema(SCHEMA, run_file_schemas(landing, SCHEMA, shard_url=shard)) == direct
    assert not (tmp_path / "shard").exists(), "reading the files' schemas wrote nothing"
    with pytest.raises(InvalidUsageError, match=r"needs a file source .* source 'fake' cannot") as e:
        run_file_schemas(FakeSource(0), SCHEMA, shard_url=shard)
    assert e.value.value == "fake"


def test_widening_types_are_taken_narrower_ones_read_as_is() -> None:
    shard = pa.schema([("n", pa.int32()), ("x", pa.float32()), ("d", pa.decimal128(10, 2)), ("s", pa.string())])
    wide = pa.schema([("n", pa.int64()), ("x", pa.float64()), ("d", pa.decimal128(12, 2)), ("s", pa.large_string())])
    target = target_schema(shard, [("f1", wide), ("f2", pa.schema([("n", pa.int8())]))])
    assert target == pa.schema([(f.name, f.type) for f in wide])
    assert sorted(c.describe() for c in changes_to(shard, target, what="t")) == [
        "widen d:decimal128(12, 2)", "widen n:int64", "widen s:large_string", "widen x:double"]


@pytest.mark.parametrize(("file_schema", "needle"), [
    (pa.schema([("amount", pa.string())]), "column 'amount' has type string; the shard's is int64"),
    (pa.schema([("amount", pa.float64())]), "column 'amount' has type double"),
    (pa.schema([("tags", pa.list_(pa.string()))]), "new column 'tags' has type list<item: string>"),
    (pa.schema([("empty", pa.null())]), "new column 'empty' has type null"),
])
def test_anything_else_is_refused_naming_the_file_and_column(file_schema: pa.Schema, needle: str) -> None:
    with pytest.raises(SchemaMismatchError, match=r"s3://b/landing/bad\.parquet") as e:
        target_schema(SCHEMA, [("s3://b/landing/ok.parquet", SCHEMA), ("s3://b/landing/bad.parquet", file_schema)])
    assert needle in str(e.value)


def test_a_file_without_a_required_shard_column_is_refused() -> None:
    shard = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    with pytest.raises(SchemaMismatchError, match=r"f\.parquet: lacks the shard's required .*\['id'\]"):
        target_schema(shard, [("f.parquet", pa.schema([("v", pa.string())]))])


def test_add_columns_reads_old_files_as_nulls_and_new_files_with_values(landing: LandingSource) -> None:
    target = target_schema(SCHEMA, landing.file_schemas(SCHEMA))
    files = {f.key: f for f in landing.files()}
    blob = landing.blob()
    old = read_landing_file(blob, files["d1/a.parquet"], target, "event_time", schema_mode="add_columns",
                            window=(0, 2 * DAY))
    csv = read_landing_file(blob, files["d1/b.csv"], target, "event_time", schema_mode="add_columns",
                            window=(0, 2 * DAY))
    new = read_landing_file(blob, files["d2/a.parquet"], target, "event_time", schema_mode="add_columns",
                            window=(0, 2 * DAY))
    for t in (old, csv, new):
        assert t.schema.names == [*target.names, TIME]
    assert old["country"].null_count == 10 and csv["country"].null_count == 10
    assert new["country"].to_pylist() == ["nl"] * 5


def test_strict_refuses_the_new_column_naming_the_file_and_column(landing: LandingSource) -> None:
    f = next(f for f in landing.files() if f.key == "d2/a.parquet")
    with pytest.raises(MalformedInputError) as e:
        read_landing_file(landing.blob(), f, SCHEMA, "event_time")
    msg = str(e.value)
    assert f"{landing.root}/d2/a.parquet" in msg and "unexpected ['country']" in msg
    assert "schema_mode='add_columns'" in msg and e.value.value == "country"


def test_a_column_the_shard_does_not_know_is_refused_only_with_rows_in_the_batch(landing: LandingSource) -> None:
    """A file that landed after the mint evolved the shard: its unknown column is dropped when
    none of its rows are in the batch (they are filtered out anyway), else refused by name."""
    f = next(f for f in landing.files() if f.key == "d2/a.parquet")
    later = read_landing_file(landing.blob(), f, SCHEMA, "event_time", schema_mode="add_columns", window=(0, DAY))
    assert later.schema.names == [*SCHEMA.names, TIME] and later.num_rows == 5
    with pytest.raises(SchemaMismatchError, match=r"d2/a\.parquet: has columns \['country'\] the shard does not "
                                                  r"know \(5 of its rows"):
        read_landing_file(landing.blob(), f, SCHEMA, "event_time", schema_mode="add_columns", window=(DAY, 2 * DAY))


def test_a_value_that_does_not_fit_still_fails_by_name(tmp_path: Path) -> None:
    root = str(tmp_path)
    land_file(root, "big.parquet", landing_table(0, DAY, 3, seed=1).set_column(
        2, "amount", pa.array([1, 2, 2**40], pa.int64())))
    src = LandingSource(root)
    narrow = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int32())])
    with pytest.raises(MalformedInputError, match=r"big\.parquet: column 'amount' does not fit"):
        read_landing_file(src.blob(), src.files()[0], narrow, "event_time", schema_mode="add_columns")


@pytest.mark.parametrize("bad", ["merge", "", None, "STRICT", 1])
def test_schema_mode_is_checked_naming_the_value(bad: object) -> None:
    with pytest.raises(InvalidUsageError, match="schema_mode must be 'strict' or 'add_columns'") as e:
        checked_schema_mode(bad)
    assert e.value.value == str(bad)
    assert checked_schema_mode("add_columns") == "add_columns"


def test_the_write_request_carries_the_mode_and_refuses_an_unknown_one() -> None:
    req = IngestWriteRequest(shard_url="file:///s", source=spec_from_builtins({"kind": "landing", "root": "/l"}),
                             desc=Description("d", 0, 1, 1), slot=0, slots=1, schema_mode="add_columns")
    text = encode_request(req)
    assert decode_request(text, IngestWriteRequest).schema_mode == "add_columns"
    old = msgspec.json.decode(text)
    del old["schema_mode"]  # an older operator's request reads strictly
    assert decode_request(msgspec.json.encode(old), IngestWriteRequest).schema_mode == "strict"
    old["schema_mode"] = "merge"
    with pytest.raises(InvalidUsageError, match=r"schema_mode"):
        decode_request(msgspec.json.encode(old), IngestWriteRequest)


def test_file_arrivals_offer_their_files_and_stamp_reads_onto_the_evolved_shard(tmp_path: Path) -> None:
    """Reclocked files have no event time: every column is a user column; a bound file's rows
    are all in its batch, so a column the shard does not know is refused by name."""
    root = str(tmp_path / "arrivals")
    land_file(root, "a.parquet", landing_table(0, DAY, 3, seed=1).drop_columns(["event_time"]))
    land_file(root, "b.parquet", _day2(2).drop_columns(["event_time"]))
    src = FileArrivals(root, remap=(tmp_path / "remap").as_uri())
    target = target_schema(SCHEMA, src.file_schemas(SCHEMA))
    assert target.names == [*SCHEMA.names, "country"]
    old = stamp(landing_table(0, DAY, 3, seed=1).drop_columns(["event_time"]), target, 7, where="a",
                schema_mode="add_columns")
    assert old["country"].null_count == 3 and old[TIME].to_pylist() == [7] * 3
    with pytest.raises(SchemaMismatchError, match=r"b: has columns \['country'\] the shard does not know"):
        stamp(_day2(2).drop_columns(["event_time"]), SCHEMA, 7, where="b", schema_mode="add_columns")
    with pytest.raises(MalformedInputError, match=r"b: columns do not match the shard: missing \[\], unexpected "
                                                  r"\['country'\]; the shard's schema is strict"):
        stamp(_day2(2).drop_columns(["event_time"]), SCHEMA, 7, where="b")
