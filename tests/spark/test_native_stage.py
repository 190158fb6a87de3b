"""Unordered parts written by Spark's own Parquet writer (spark/native_stage.py): the same
rows, files and errors as the executors' pyarrow path, and only committed files listed."""

from __future__ import annotations

import math
import re
import struct
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import InvalidUsageError, Shard, StagedBatch
from shardsink.core import fate as ft
from shardsink.core.builder import PartWriterSpec
from shardsink.outcome import record_of
from shardsink.spark.native_stage import native_plan
from shardsink.spark.stage import stage_dataframe

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.float64()), ("n", pa.int32())])
DDL = "k string, x double, n int, _time long, _diff long"
ROWS = [("b", 1.0, 1, 3, 1), ("a", 2.0, 2, 1, 1), ("b", 1.0, 1, 3, 2), ("c", None, None, 2, 1),
        ("a", 2.0, 2, 1, -1), (None, 0.5, 3, 5, 1), ("b", 1.0, 1, 3, -1), ("z", -0.0, 4, 6, 1),
        ("z", 0.0, 4, 6, 1), ("q", float("nan"), 5, 7, 1), ("q", -float("nan"), 5, 7, 1)]
_PART = re.compile(r"^parts/(?P<desc>[^/]+)/[0-9a-f]{32}\.parquet$")


def _model(rows: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    c: Counter[tuple[Any, ...]] = Counter()
    for k, x, n, _t, d in rows:
        x = None if x is None else ("nan" if math.isnan(x) else x + 0.0)
        c[(k, x, n)] += d
    return +c


def _snapshot(s: Shard) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for r in s.snapshot().to_pylist():
        x = None if r["x"] is None else ("nan" if math.isnan(r["x"]) else r["x"])
        out[(r["k"], x, r["n"])] += r["_count"]
    return out


def _files(root: Path, desc: str) -> list[str]:
    base = root / "parts" / desc
    return sorted(p.relative_to(root).as_posix() for p in base.rglob("*") if p.is_file()) if base.exists() else []


def test_native_parts_snapshot_equals_the_model_and_match_the_python_paths_files(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(ROWS, DDL).repartition(3)
    spec = Shard((tmp_path / "s").as_uri()).writer().part_writer("d", order="unordered")
    assert native_plan(df, spec, schema=SCHEMA) is not None
    assert native_plan(df, replace(spec, dry_run=True), schema=SCHEMA) is None, "a dry run writes nothing"
    got: dict[str, Shard] = {}
    for writer in ("auto", "python"):
        s = Shard.create((tmp_path / writer).as_uri(), SCHEMA)
        parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d",
                                order="unordered", writer=writer)  # type: ignore[arg-type]
        assert parts and all(p.order == "unordered" and p.rows > 0 for p in parts)
        assert sum(p.rows for p in parts) == len(ROWS), "unordered staging neither sorts nor consolidates"
        assert all(_PART.match(p.key) for p in parts), [p.key for p in parts]
        assert _files(tmp_path / writer, "d") == sorted(p.key for p in parts), "only the parts stay"
        for p in parts:
            f = pq.ParquetFile(tmp_path / writer / p.key)
            t = f.read()
            assert (p.rows, p.bytes) == (t.num_rows, (tmp_path / writer / p.key).stat().st_size)
            assert (p.min_time, p.max_time) == (min(t["_time"].to_pylist()), max(t["_time"].to_pylist()))
            assert f.schema_arrow.remove_metadata() == pa.schema(
                [*SCHEMA, pa.field("_time", pa.int64(), False), pa.field("_diff", pa.int64(), False)])
            for x in t["x"].to_pylist():  # canonical floats on disk: no -0.0, one NaN bit pattern
                if x is not None:
                    assert struct.pack("<d", x) != struct.pack("<d", -0.0)
                    assert not math.isnan(x) or struct.pack("<d", x) == struct.pack("<Q", 0x7FF8000000000000)
        s.compare_and_append([StagedBatch("d", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="d")
        got[writer] = s
    assert _snapshot(got["auto"]) == _snapshot(got["python"]) == _model(ROWS)


def test_a_frame_without_diff_is_written_with_diff_one(spark: Any, tmp_path: Path) -> None:
    """Also: a description id as Airflow run ids make them (``+00-00``): the folder Spark writes is
    the one the driver lists (a percent-encoded URI would make Hadoop write ``%2B`` literally)."""
    df = spark.createDataFrame([(r[0], r[1], r[2], r[3]) for r in ROWS], "k string, x double, n int, _time int")
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    d = "ingest-manual__2024-01-02T00-00-00.1+00-00-a1-7137"
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id=d, order="unordered",
                            writer="spark")
    s.compare_and_append([StagedBatch(d, 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id=d)
    assert _snapshot(s) == _model([(*r[:4], 1) for r in ROWS])


#: SCHEMA with ``k`` required (issue 32: a null there is refused naming ``k`` and the count).
REQUIRED_K = SCHEMA.set(0, SCHEMA.field("k").with_nullable(False))


@pytest.mark.parametrize("bad", [(("a", 1.0, 1, 10, 1), "outside the batch bounds"),
                                 (("a", 1.0, 1, -1, 1), "outside the batch bounds"),
                                 (("a", 1.0, 1, 3, 0), "zero values"),
                                 (("a", 1.0, 1, None, 1), "null values; times must be set"),
                                 (("a", 1.0, 1, 3, None), "'_diff' has 1 null values"),
                                 ((None, 1.0, 1, 3, 1), "'k' has 1 null values; the shard's schema declares it "
                                                        "required")])
def test_invalid_rows_are_refused_with_the_python_paths_error_and_nothing_is_committed(
        spark: Any, tmp_path: Path, bad: tuple[tuple[Any, ...], str]) -> None:
    row, words = bad
    schema = REQUIRED_K if "'k'" in words else SCHEMA
    df = spark.createDataFrame([*ROWS[:4], row], DDL).coalesce(1)  # one partition: the same counts both ways
    records = {}
    for writer in ("spark", "python"):
        s = Shard.create((tmp_path / writer).as_uri(), schema)
        with pytest.raises(Exception) as e:
            stage_dataframe(df, shard_url=s.url, schema=schema, lower=0, upper=10, desc_id="d", order="unordered",
                            writer=writer)  # type: ignore[arg-type]
        if writer == "spark":
            assert isinstance(e.value, InvalidUsageError)
        records[writer] = record_of(e.value)
        assert _files(tmp_path / writer, "d") == [], "nothing of a refused input stays"
        assert s.batches() == ()
    assert records["spark"] == records["python"]
    assert records["spark"].error_class == "InvalidUsageError" and words in records["spark"].message
    if schema is REQUIRED_K:  # without the null, Spark writes k required, as the Python path does
        parts = stage_dataframe(df.filter("k IS NOT NULL"), shard_url=s.url, schema=schema, lower=0, upper=10,
                                desc_id="d", order="unordered", writer="spark")
        assert {pq.read_schema(tmp_path / "python" / p.key).field("k").nullable for p in parts} == {False}


def test_a_rerun_twin_leaves_only_leftovers_that_the_append_deletes(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(ROWS, DDL).repartition(2)
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    first = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered")
    second = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered")
    assert not {p.key for p in first} & {p.key for p in second}, "fresh keys per run"
    # a driver killed after Spark's commit, before the rename: its folder stays under the prefix
    killed = tmp_path / "s" / "parts" / "d" / "spark-0123"
    killed.mkdir()
    (killed / "part-00000-x.snappy.parquet").write_bytes((tmp_path / "s" / first[0].key).read_bytes())
    (killed / "_SUCCESS").write_bytes(b"")
    s.compare_and_append([StagedBatch("d", 0, 10, tuple(second))], expected_upper=0, new_upper=10, desc_id="d")
    assert _snapshot(s) == _model(ROWS), "only the committed run counts"
    gone = ft.delete_staged(s._machine, "d", 0)
    assert isinstance(gone.fate, ft.Committed) and gone.parts == len(first) + 2
    assert _files(tmp_path / "s", "d") == sorted(p.key for p in second)
    assert _snapshot(s) == _model(ROWS)


def test_writer_spark_refuses_what_it_cannot_write_exactly_and_auto_falls_back(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1.0, 7, 3, 1)], "k string, x double, n long, _time long, _diff long")
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    with pytest.raises(InvalidUsageError, match="cannot write the parts"):  # a long into the shard's int32
        stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered",
                        writer="spark")
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered")
    assert [p.rows for p in parts] == [1]
    assert native_plan(df, PartWriterSpec(url="s3://bucket/shard", desc_id="d"), schema=SCHEMA) is None
    with pytest.raises(InvalidUsageError, match="writer must be"):
        stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered",
                        writer="jvm")  # type: ignore[arg-type]


def test_an_empty_frame_stages_no_part_and_leaves_no_file(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([], DDL)
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    assert stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered",
                           writer="spark") == []
    assert _files(tmp_path / "s", "d") == []


def test_non_nullable_columns_are_written_as_they_are_and_checked_from_the_footers_of_every_file(
        spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    base = spark.range(40, numPartitions=4)
    cols = [F.col("id").cast("string").alias("k"), (F.col("id") * 0.5).alias("x"), F.col("id").cast("int").alias("n"),
            F.least(F.col("id"), F.lit(9).cast("long")).alias("_time")]
    df = base.select(*cols)
    assert not any(f.nullable for f in df.schema.fields if f.name == "_time"), "the case: no null guard needed"
    s = Shard.create((tmp_path / "s").as_uri(), SCHEMA)
    parts = stage_dataframe(df, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="d", order="unordered",
                            writer="spark")
    for p in parts:
        got = pq.ParquetFile(tmp_path / "s" / p.key).schema_arrow
        assert got.field("_time") == pa.field("_time", pa.int64(), False), "written required, as the Python path does"
        assert "_diff" not in got.names and p.diffs == "ones", "a frame without _diff stores no diffs"
    s.compare_and_append([StagedBatch("d", 0, 10, tuple(parts))], expected_upper=0, new_upper=10, desc_id="d")
    assert sum(_snapshot(s).values()) == 40
    # zero diffs in every partition's file: the count is over all files, and nothing stays
    zeros = base.select(*cols, F.when(F.col("id") % 5 == 0, F.lit(0)).otherwise(F.lit(1)).cast("long").alias("_diff"))
    with pytest.raises(InvalidUsageError, match=r"'_diff' has 8 zero values; diffs must be non-zero"):
        stage_dataframe(zeros, shard_url=s.url, schema=SCHEMA, lower=0, upper=10, desc_id="e", order="unordered",
                        writer="spark")
    assert _files(tmp_path / "s", "e") == []
