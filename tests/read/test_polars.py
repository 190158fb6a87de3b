"""shardsink.read.polars: leased Polars LazyFrames equal to an independent model, on both backends."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa
import pytest
import scenarios
from read_helpers import SCHEMA, Model, write_history

import shardsink.read
from shardsink import CorruptionError, InvalidUsageError, ReadFrontierError, Shard


def _read(url: str, as_of: int | None = None, **kw: Any) -> shardsink.read.LeasedRead[pl.LazyFrame]:
    return shardsink.read.polars(url, as_of, **kw)


ENGINE = scenarios.Engine(read=_read, rows=lambda lf: lf.collect().rows(), arrow=lambda lf: lf.collect().to_arrow())


def test_polars_snapshots_and_changes_equal_the_model(shard_url: str) -> None:
    scenarios.snapshots_and_changes_equal_the_model(ENGINE, shard_url)


def test_polars_normalises_floats_in_parts_without_nulls(tmp_path: Any) -> None:
    scenarios.floats_without_nulls_are_normalised(ENGINE, f"file://{tmp_path}/s")


def test_polars_as_of_schema_reads_equal_the_pyarrow_reads(shard_url: str) -> None:
    scenarios.as_of_schema_reads_equal_the_pyarrow_reads(ENGINE, shard_url)


def test_polars_diff_sums_never_wrap_past_int64(tmp_path: Any) -> None:
    scenarios.diff_sums_never_wrap(ENGINE, f"file://{tmp_path}/s")


def test_polars_gc_cannot_delete_a_part_under_a_reader(shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scenarios.gc_cannot_delete_a_part_under_a_reader(ENGINE, shard_url, monkeypatch)


def test_polars_lease_lives_as_long_as_the_returned_frame(tmp_path: Any) -> None:
    scenarios.lease_lives_as_long_as_the_returned_object(ENGINE, f"file://{tmp_path}/s")


def test_polars_frame_is_lazy_and_pushes_the_work_into_polars(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    write_history(shard, Model(), batches=3, seed=5)
    with shardsink.read.polars(url, as_of=15) as lf:
        assert isinstance(lf, pl.LazyFrame)
        plan = lf.explain()
        assert "Parquet SCAN" in plan and "AGGREGATE" in plan and "_time" in plan


def test_polars_negative_multiplicity_fails_collect_naming_the_shard(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    shard.append(pa.table({"x": [1.0], "k": ["a"], "n": [1], "_time": [0], "_diff": [-1]}), lower=0, upper=10)
    with shardsink.read.polars(url) as lf, pytest.raises(CorruptionError, match="negative multiplicity") as e:
        lf.collect()
    assert url in str(e.value)


def test_polars_refuses_bad_reads_and_leaves_no_lease(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    shard = Shard.create(url, SCHEMA)
    write_history(shard, Model(), batches=1, seed=2)
    for bad in (-1, 10, True, "5", 2**63):
        with pytest.raises((InvalidUsageError, ReadFrontierError)):
            shardsink.read.polars(url, bad)
    for rng in ((5, 3), (0, 11), (0,), [0, 5], (0.5, 3)):
        with pytest.raises((InvalidUsageError, ReadFrontierError)):
            shardsink.read.polars(url, changes=rng)  # type: ignore[arg-type]
    for choice in ("bogus", None, 1, "AS_OF"):
        with pytest.raises(InvalidUsageError, match="expected 'current' or 'as_of'") as e:
            shardsink.read.polars(url, schema=choice)  # type: ignore[arg-type]
        assert repr(choice) in str(e.value)
    with pytest.raises(InvalidUsageError, match="not both"):
        shardsink.read.polars(url, 3, changes=(0, 5))
    assert not shard.leases()


def test_polars_empty_reads_have_the_result_schema(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/s"
    Shard.create(url, SCHEMA, upper=10)
    with shardsink.read.polars(url) as lf:
        out = lf.collect()
        assert out.columns == ["x", "k", "n", "_count"] and out.height == 0
    with shardsink.read.polars(url, changes=(0, 10)) as lf:
        out = lf.collect()
        assert out.columns == ["x", "k", "n", "_time", "_diff"] and out.height == 0


def test_polars_frame_on_s3_serialises_without_the_secret(moto: Any) -> None:
    """A LazyFrame's plan can be serialised (shipped, logged): the S3 secret is never in it."""
    import os
    import uuid

    from support import SCHEMA as PLAIN

    url = f"s3://shardsink-test/shard-{uuid.uuid4().hex[:12]}"  # tests/conftest.py BUCKET
    Shard.create(url, PLAIN, upper=0)
    with shardsink.read.polars(url, changes=(0, 0)) as lf:
        blob = lf.serialize()
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    assert secret and secret not in blob
