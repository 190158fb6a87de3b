"""Schema evolution (issue 19 §1): allowed and refused changes, appends under older schema ids,
reads projected by field id, ``schema="as_of"``, and the format-1 fixture shard evolving."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink.cli import main
from shardsink.core import schema as sch
from shardsink.core import transitions as tr
from shardsink.core.commands import AppendCommand, Stamp
from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, InvalidUsageError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "shard-format1"
SCHEMA = pa.schema([pa.field("k", pa.int32(), False), pa.field("v", pa.string()), pa.field("f", pa.float32()),
                    pa.field("d", pa.decimal128(5, 2))])


def _rows(k: list[int], t: int, diff: int = 1) -> pa.Table:
    n = len(k)
    return pa.table({"k": pa.array(k, pa.int32()), "v": [f"v{x}" for x in k], "f": pa.array([0.5] * n, pa.float32()),
                     "d": pa.array([None] * n, pa.decimal128(5, 2)), "_time": [t] * n, "_diff": [diff] * n})


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    s.append(_rows([1, 2], 0), lower=0, upper=10)
    return s


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def test_a_shard_that_never_evolved_stores_no_history_and_derives_ids_by_position(shard: Shard) -> None:
    (e,) = shard.schema_history()
    assert (e.id, [f.id for f in e.fields], [f.name for f in e.fields]) == (0, [1, 2, 3, 4], ["k", "v", "f", "d"])
    data = shard._machine.blob.get("state/v/00000000000000000001.json")
    assert data is not None and b"schemas" not in data.data and b"schema_id" not in data.data


def test_allowed_changes_commit_one_version_each_and_reads_project_by_field_id(shard: Shard) -> None:
    for c in (SchemaChange(kind="widen", name="k", type="int64"), SchemaChange(kind="widen", name="f", type="double"),
              SchemaChange(kind="widen", name="d", type="decimal128(12,2)"),
              SchemaChange(kind="widen", name="v", type="large_string"), SchemaChange(kind="nullable", name="k"),
              SchemaChange(kind="rename", name="v", new_name="w"),
              SchemaChange(kind="add", name="x", type="timestamp[ms]"),
              SchemaChange(kind="drop", name="f")):
        before = shard.info().seqno
        v = shard.evolve(c)
        assert v.seqno == before + 1 and v.commit.kind == "schema"
    hist = shard.schema_history()
    assert [e.id for e in hist] == list(range(9))
    assert [(f.id, f.name, f.type) for f in hist[-1].fields] == [
        (1, "k", "int64"), (2, "w", "large_string"), (4, "d", "decimal128(12, 2)"), (5, "x", "timestamp[ms]")]
    assert shard.schema == pa.schema([("k", pa.int64()), ("w", pa.large_string()), ("d", pa.decimal128(12, 2)),
                                      ("x", pa.timestamp("ms"))])
    snap = shard.snapshot()
    assert snap.schema.names == ["k", "w", "d", "x", "_count"]
    assert snap.sort_by("k").to_pylist() == [{"k": 1, "w": "v1", "d": None, "x": None, "_count": 1},
                                             {"k": 2, "w": "v2", "d": None, "x": None, "_count": 1}]
    assert shard.changes(0, 10).schema.names == ["k", "w", "d", "x", "_time", "_diff"]
    assert [c.kind for _, c in shard.log(limit=9)] == ["schema"] * 8 + ["append"]


def test_a_dropped_name_can_be_added_again_with_a_new_field_id_and_old_data_stays_hidden(shard: Shard) -> None:
    shard.evolve(SchemaChange(kind="drop", name="v"))
    shard.evolve(SchemaChange(kind="add", name="v", type="string"))
    assert [f.id for f in shard.schema_history()[-1].fields] == [1, 3, 4, 5]
    assert shard.snapshot().column("v").to_pylist() == [None, None]


REFUSED = [
    (["--widen", "k:int16"], "cannot change column 'k' from int32 to int16"),
    (["--widen", "v:int64"], "cannot change column 'v' from string to int64"),
    (["--widen", "f:float16"], "cannot change column 'f' from float to halffloat"),
    (["--widen", "d:decimal128(12,3)"], "from decimal128(5, 2) to decimal128(12, 3)"),
    (["--add", "z:int64", "--required"], "cannot add non-nullable column 'z' (int64) to a shard that holds data"),
    (["--add", "v:string"], "a column 'v' (string) exists; --drop v first"),
    (["--rename", "v:k"], "a column 'k' exists"),
    (["--drop", "nope"], "column 'nope' does not exist"),
    (["--nullable", "v"], "column 'v' (string) is already nullable"),
    (["--add", "z:bogus"], "type 'bogus' is not a pyarrow type alias"),
    (["--add", "_time:int64"], "is reserved"),
    (["--rename", "v:_count"], "is reserved"),
    (["--add", "_Diff:int64"], "is reserved"),
    (["--add", "K:int64"], "has columns 'k' and 'K', equal ignoring case"),
    (["--rename", "v:F"], "has columns 'F' and 'f', equal ignoring case"),
    (["--rename", "v"], "must be of the form OLD:NEW"),
]


@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_each_refused_change_exits_2_with_its_message_and_leaves_the_shard_byte_identical(
        shard: Shard, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    root = tmp_path / "s"
    before = _digest(root)
    assert main(["schema", shard.url, *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert _digest(root) == before


def test_a_column_renamed_to_another_case_of_its_name_reads_on_every_engine(shard: Shard) -> None:
    import duckdb

    import shardsink.read

    shard.evolve(SchemaChange(kind="rename", name="k", new_name="K"))
    with pytest.raises(InvalidUsageError, match="'K' and 'k', equal ignoring case"):
        shard.evolve(SchemaChange(kind="add", name="k", type="int64"))
    with shardsink.read.duckdb(duckdb.connect(), shard.url) as rel:
        assert rel.columns[0] == "K" and sorted(r[0] for r in rel.fetchall()) == [1, 2]
    with shardsink.read.polars(shard.url) as lf:
        assert lf.collect()["K"].sort().to_list() == [1, 2]


def test_nulls_in_a_required_column_are_refused_naming_it_and_the_count_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CLI (exit 2) and Python API; the Spark staging paths: tests/spark/test_native_stage.py."""
    url = Shard.create((tmp_path / "s").as_uri(), pa.schema([("id", pa.int64())])).url
    assert main(["schema", url, "--add", "req:int64", "--required"]) == 0
    s = Shard.open(url)
    before = _digest(tmp_path / "s")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "req": null, "_time": 0}\n{"id": 2, "req": 5, "_time": 0}\n{"id": 3, "_time": 0}\n')
    capsys.readouterr()
    assert main(["append", s.url, "--lower", "0", "--upper", "10", "--input", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "column 'req' has 2 null values; the shard's schema declares it required" in err, err
    with pytest.raises(InvalidUsageError, match="column 'req' has 1 null values") as e:
        s.append(pa.table({"id": [1, 2], "req": pa.array([None, 7], pa.int64()), "_time": [0, 0]}), lower=0,
                 upper=10)
    assert e.value.value == "req"
    assert _digest(tmp_path / "s") == before
    s.append(pa.table({"id": [1], "req": [7], "_time": [0]}), lower=0, upper=10)
    assert s.snapshot().to_pylist() == [{"id": 1, "req": 7, "_count": 1}]


def test_the_cli_shows_the_history_and_commits_changes(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", shard.url, "--rename", "v:w"]) == 0
    assert "schema 1 committed at seqno 2" in capsys.readouterr().out
    assert main(["schema", shard.url, "--json"]) == 0
    import json

    hist = json.loads(capsys.readouterr().out)
    assert [(e["id"], e["seqno"], e["upper"]) for e in hist] == [(0, 0, None), (1, 2, 10)]
    assert [f["name"] for f in hist[1]["fields"]] == ["k", "w", "f", "d"]
    assert main(["log", shard.url, "--json"]) == 0
    log = json.loads(capsys.readouterr().out)
    assert log[0]["kind"] == "schema" and log[0]["change"] == "rename v:w"
    assert (log[0]["old_id"], log[0]["new_id"]) == (0, 1) and "lower" not in log[0]


def test_an_append_staged_under_an_older_schema_commits_and_reads_through_its_own_schema(shard: Shard) -> None:
    staged = shard.stage(_rows([3], 10), lower=10, upper=20, desc_id="old")
    assert staged.schema_id == 0
    shard.evolve(SchemaChange(kind="rename", name="v", new_name="w"))
    shard.evolve(SchemaChange(kind="widen", name="k", type="int64"))
    assert shard.compare_and_append([staged], expected_upper=10, new_upper=20, desc_id="old").status == "committed"
    assert shard.batches()[-1].schema_id == 0
    snap = shard.snapshot().sort_by("k")
    assert snap.column("k").to_pylist() == [1, 2, 3] and snap.column("w").to_pylist() == ["v1", "v2", "v3"]


def test_an_append_under_a_schema_the_shard_does_not_know_is_refused_as_bad_input(shard: Shard) -> None:
    before = shard.info().seqno
    cmd = AppendCommand("x", 10, 20, shard.batches()[0].parts, (), schema_id=7)
    with pytest.raises(InvalidUsageError, match=r"schema id 7 is unknown .* knows schema ids \[0\]"):
        shard.writer().commit(cmd)
    assert shard.info().seqno == before
    out = tr.apply(shard.reader().head().header, (), AppendCommand("y", 10, 20, (), (), 0), Stamp("w", "now", "n"))
    assert not isinstance(out, tr.Refusal.__args__)  # type: ignore[attr-defined]


def test_schema_as_of_reads_with_the_schema_current_at_the_read_time(shard: Shard) -> None:
    shard.evolve(SchemaChange(kind="add", name="x", type="int64"))
    shard.append(_rows([3], 10).append_column("x", pa.array([7])).select(["k", "v", "f", "d", "x", "_time", "_diff"]),
                 lower=10, upper=20)
    assert shard.snapshot(5, schema="as_of").schema.names == ["k", "v", "f", "d", "_count"]
    assert shard.snapshot(15, schema="as_of").schema.names == ["k", "v", "f", "d", "x", "_count"]
    assert shard.snapshot(5).column("x").to_pylist() == [None, None]
    assert shard.changes(0, 10, schema="as_of").schema.names == ["k", "v", "f", "d", "_time", "_diff"]
    assert sch.as_of(shard.reader().head().header, 10).id == 1
    with pytest.raises(InvalidUsageError, match="not a schema choice"):
        shard.snapshot(5, schema="later")  # type: ignore[arg-type]


@pytest.mark.parametrize(("alias", "expected"), [
    ("int64", pa.int64()), ("string", pa.string()), ("double", pa.float64()), ("timestamp[ms]", pa.timestamp("ms")),
    ("timestamp[us, tz=UTC]", pa.timestamp("us", tz="UTC")), ("decimal128(12,2)", pa.decimal128(12, 2)),
    ("large_string", pa.large_string()), ("bool", pa.bool_())])
def test_type_aliases_parse(alias: str, expected: pa.DataType) -> None:
    assert sch.parse_type(alias) == expected


@pytest.mark.parametrize("alias", ["", "decimal128(40,2)", "decimal128(5,6)", "list<int64>", "int64; rm -rf",
                                   "x" * 200])
def test_unknown_or_out_of_range_type_aliases_are_refused(alias: str) -> None:
    with pytest.raises(InvalidUsageError):
        sch.parse_type(alias)


def test_the_format1_fixture_shard_reads_and_evolves_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "old"
    shutil.copytree(FIXTURE, root)
    old = Shard.open(root.as_uri())
    before = old.snapshot(399).to_pylist()
    assert [(f.id, f.name) for f in old.schema_history()[0].fields] == [(1, "k"), (2, "n")]
    assert all(b.schema_id == 0 for b in old.batches())
    old.evolve(SchemaChange(kind="rename", name="n", new_name="m"))
    old.evolve(SchemaChange(kind="add", name="note", type="string"))
    again = Shard.open(old.url)
    assert again.snapshot(399).to_pylist() == [{"k": r["k"], "m": r["n"], "note": None, "_count": 1} for r in before]
    assert again.snapshot(5, schema="as_of").to_pylist() == [{"k": "k0", "n": 0, "_count": 1}]
    assert again.changes(0, 400).num_rows == 79


def test_the_cli_reads_with_the_current_or_the_as_of_schema(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    shard.evolve(SchemaChange(kind="rename", name="v", new_name="w"))
    assert main(["snapshot", shard.url, "--as-of", "5"]) == 0
    assert list(json.loads(capsys.readouterr().out.splitlines()[0])) == ["k", "w", "f", "d", "_count"]
    assert main(["changes", shard.url, "--from", "0", "--to", "10", "--schema", "as_of"]) == 0
    # the rename committed at upper 10: times before it read with the old name
    assert list(json.loads(capsys.readouterr().out.splitlines()[0])) == ["k", "v", "f", "d", "_time", "_diff"]


def test_a_value_that_does_not_fit_the_readers_narrower_type_is_corruption_naming_the_column() -> None:
    """project runs after the read's time filter: a value left that the older schema cannot
    hold (k = 2**40 under k: int32) is corruption, named by column, not an ArrowInvalid."""
    narrow = sch.make_entry(pa.schema([("k", pa.int32()), ("v", pa.string())]), [1, 2], id=0, seqno=0, at="",
                            upper=None)
    wide = sch.make_entry(pa.schema([("k", pa.int64()), ("v", pa.string())]), [1, 2], id=1, seqno=3, at="", upper=30)
    part = pa.table({"k": pa.array([1, 2**40], pa.int64()), "v": ["a", "b"], "_time": [0, 30], "_diff": [1, 1]})
    assert sch.project(part.slice(0, 1), wide, narrow)["k"].type == pa.int32()
    with pytest.raises(CorruptionError, match=r"^shard X: column 'k' \(field id 1, stored as 'k'\) holds a value that "
                                              r"is not a int32 under the schema at the read's time"):
        sch.project(part, wide, narrow, where="shard X")
