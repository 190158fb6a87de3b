"""shardsink.read.duckdb: leased DuckDB relations equal to an independent model, on both backends."""

from __future__ import annotations

import uuid
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import scenarios
from read_helpers import SCHEMA, Model, as_counter, write_history

import shardsink.read
from shardsink import InvalidUsageError, ReadFrontierError, Shard


def _read(url: str, as_of: int | None = None, **kw: Any) -> shardsink.read.LeasedRead[duckdb.DuckDBPyRelation]:
    return shardsink.read.duckdb(duckdb.connect(), url, as_of, **kw)


ENGINE = scenarios.Engine(read=_read, rows=lambda rel: rel.fetchall(), arrow=lambda rel: rel.to_arrow_table(),
                          corruption=duckdb.Error)


def test_duckdb_snapshots_and_changes_equal_the_model(shard_url: str) -> None:
    scenarios.snapshots_and_changes_equal_the_model(ENGINE, shard_url)


def test_duckdb_normalises_floats_in_parts_without_nulls(tmp_path: Any) -> None:
    scenarios.floats_without_nulls_are_normalised(ENGINE, f"file://{tmp_path}/s")


def test_duckdb_as_of_schema_reads_equal_the_pyarrow_reads(shard_url: str) -> None:
    scenarios.as_of_schema_reads_equal_the_pyarrow_reads(ENGINE, shard_url)


def test_duckdb_diff_sums_never_wrap_past_int64(tmp_path: Any) -> None:
    scenarios.diff_sums_never_wrap(ENGINE, f"file://{tmp_path}/s")


def test_duckdb_gc_cannot_delete_a_part_under_a_reader(shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scenarios.gc_cannot_delete_a_part_under_a_reader(ENGINE, shard_url, monkeypatch)


def test_duckdb_lease_lives_as_long_as_the_returned_relation(tmp_path: Any) -> None:
    scenarios.lease_lives_as_long_as_the_returned_object(ENGINE, f"file://{tmp_path}/s")


def test_duckdb_reads_s3_without_any_extension(moto: Any) -> None:
    """No httpfs: DuckDB scans a pyarrow dataset over pyarrow's S3 filesystem (nothing downloaded)."""
    url = f"s3://shardsink-test/noext-{uuid.uuid4().hex[:8]}"
    shard = Shard.create(url, SCHEMA)
    model = Model()
    write_history(shard, model, batches=2, seed=9)
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    with shardsink.read.duckdb(con, url, as_of=15) as rel:
        assert as_counter(rel.fetchall()) == model.snapshot(15)
    loaded = con.sql("SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name IN "
                     "('httpfs', 'aws')").fetchall()
    assert loaded == []


def test_duckdb_relation_is_lazy_and_pushes_the_work_into_duckdb(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    write_history(shard, Model(), batches=3, seed=5)
    with shardsink.read.duckdb(duckdb.connect(), url, as_of=15) as rel:
        plan = rel.explain()
        assert "PARQUET_SCAN" in plan.upper().replace(" ", "_") or "READ_PARQUET" in plan.upper()
        assert "GROUP BY" in plan.upper() and "_time" in plan


def test_duckdb_negative_multiplicity_fails_the_query_naming_the_shard(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    shard.append(pa.table({"x": [1.0], "k": ["a"], "n": [1], "_time": [0], "_diff": [-1]}), lower=0, upper=10)
    with shardsink.read.duckdb(duckdb.connect(), url) as rel, pytest.raises(duckdb.Error) as e:
        rel.fetchall()
    assert "CorruptionError" in str(e.value) and url in str(e.value)


def test_duckdb_refuses_bad_reads_and_leaves_no_lease(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    write_history(shard, Model(), batches=1, seed=2)
    con = duckdb.connect()
    for bad in (-1, 10, True, "5", 2**63):
        with pytest.raises((InvalidUsageError, ReadFrontierError)):
            shardsink.read.duckdb(con, url, bad)
    for rng in ((5, 3), (0, 11), (0,), [0, 5], (0.5, 3)):
        with pytest.raises((InvalidUsageError, ReadFrontierError)):
            shardsink.read.duckdb(con, url, changes=rng)  # type: ignore[arg-type]
    for choice in ("bogus", None, 1, "AS_OF"):
        with pytest.raises(InvalidUsageError, match="expected 'current' or 'as_of'") as e:
            shardsink.read.duckdb(con, url, schema=choice)  # type: ignore[arg-type]
        assert repr(choice) in str(e.value)
    with pytest.raises(InvalidUsageError, match="not both"):
        shardsink.read.duckdb(con, url, 3, changes=(0, 5))
    with pytest.raises(InvalidUsageError, match="DuckDBPyConnection"):
        shardsink.read.duckdb("not a connection", url)  # type: ignore[arg-type]
    assert not shard.leases()


def test_duckdb_empty_reads_have_the_result_schema(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    Shard.create(url, SCHEMA, upper=10)
    with shardsink.read.duckdb(duckdb.connect(), url) as rel:
        assert rel.columns == ["x", "k", "n", "_count"] and rel.fetchall() == []
    with shardsink.read.duckdb(duckdb.connect(), url, changes=(0, 10)) as rel:
        assert rel.columns == ["x", "k", "n", "_time", "_diff"] and rel.fetchall() == []
