"""The materialize sink's correction ``desired - persisted``, staged with the real
``stage_dataframe`` and committed, on real Spark (local[2]) and both backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from shardsink import CorruptionError, InvalidUsageError, Shard, StagedBatch
from shardsink.spark.correction import compute_correction
from shardsink.spark.read import ShardReads
from shardsink.spark.stage import stage_dataframe

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])


def _desired(spark: Any, rows: list[tuple[str | None, int]]) -> Any:
    return spark.createDataFrame(rows, "k string, n bigint")


def _run(spark: Any, out: Shard, desired_rows: list[tuple[str | None, int]], lower: int, upper: int) -> Counter[Any]:
    """One view run over ``[lower, upper)``: the correction as {(k, n, time): diff}, staged and committed."""
    desc = f"view-{lower}-{upper}"
    with ShardReads(spark) as reads:
        corr = compute_correction(reads, _desired(spark, desired_rows), out.url, lower=lower, upper=upper)
        got = corr.toArrow()
        parts = stage_dataframe(corr, shard_url=out.url, schema=out.schema, lower=lower, upper=upper, desc_id=desc)
    out.compare_and_append([StagedBatch(desc, lower, upper, tuple(parts))], expected_upper=lower,
                           new_upper=upper, desc_id=desc)
    assert got.column_names == ["k", "n", "_time", "_diff"]
    return Counter({(k, n, t): d for k, n, t, d in zip(*(got[c].to_pylist() for c in got.column_names),
                                                       strict=True)})


def _contents(out: Shard, as_of: int) -> Counter[Any]:
    snap = out.snapshot(as_of)
    return Counter({(k, n): c for k, n, c in zip(snap["k"].to_pylist(), snap["n"].to_pylist(),
                                                 snap["_count"].to_pylist(), strict=True)})


DESIRED = [("a", 1), ("b", 2), ("b", 2), (None, 3)]


def test_first_run_writes_desired_then_unchanged_is_empty(spark: Any, shard_url: str) -> None:
    out = Shard.create(shard_url, SCHEMA, upper=100)
    first = _run(spark, out, DESIRED, 100, 110)
    assert first == Counter({("a", 1, 109): 1, ("b", 2, 109): 2, (None, 3, 109): 1})
    assert _contents(out, 109) == Counter(DESIRED)
    assert _run(spark, out, DESIRED, 110, 120) == Counter()
    assert out.info().upper == 120 and _contents(out, 119) == Counter(DESIRED)


def test_changed_rows_yield_exactly_the_difference(spark: Any, tmp_path: Any) -> None:
    out = Shard.create(f"file://{tmp_path}/view", SCHEMA)
    _run(spark, out, DESIRED, 0, 10)
    changed = [("b", 2), (None, 3), ("c", 4), ("c", 4)]
    assert _run(spark, out, changed, 10, 20) == Counter({("a", 1, 19): -1, ("b", 2, 19): -1, ("c", 4, 19): 2})
    assert _contents(out, 19) == Counter(changed)
    assert _contents(out, 9) == Counter(DESIRED)  # history is kept


def test_foreign_rows_in_the_output_are_corrected(spark: Any, tmp_path: Any) -> None:
    out = Shard.create(f"file://{tmp_path}/view", SCHEMA)
    _run(spark, out, DESIRED, 0, 10)
    junk = pa.table({"k": ["zzz", "a"], "n": [9, 1], "_time": [12, 15], "_diff": [2, -1]})
    out.append(junk, lower=10, upper=20, desc_id="tamper")  # a racing run or a human
    assert _run(spark, out, DESIRED, 20, 30) == Counter({("zzz", 9, 29): -2, ("a", 1, 29): 1})
    assert _contents(out, 29) == Counter(DESIRED)


def test_desired_from_a_shard_snapshot_uses_count(spark: Any, tmp_path: Any) -> None:
    src = Shard.create(f"file://{tmp_path}/src", SCHEMA)
    src.append(pa.table({"k": ["a", "b"], "n": [1, 2], "_time": [3, 4], "_diff": [1, 3]}), lower=0, upper=10)
    out = Shard.create(f"file://{tmp_path}/view", SCHEMA)
    out.append(pa.table({"k": ["a"], "n": [1], "_time": [0], "_diff": [5]}), lower=0, upper=10)
    with ShardReads(spark) as reads:
        corr = compute_correction(reads, reads.snapshot(src.url, 9), out.url, lower=10, upper=20).toArrow()
    assert sorted(corr.to_pylist(), key=str) == [
        {"k": "a", "n": 1, "_time": 19, "_diff": -4}, {"k": "b", "n": 2, "_time": 19, "_diff": 3}]


def test_schema_change_is_refused_before_any_job(spark: Any, tmp_path: Any) -> None:
    out = Shard.create(f"file://{tmp_path}/view", SCHEMA)
    bad = {
        "n: desired int, shard bigint": spark.createDataFrame([("a", 1)], "k string, n int"),
        r"unexpected columns \['extra'\]": spark.createDataFrame([("a", 1, 2)], "k string, n bigint, extra int"),
        r"missing columns \['n'\]": spark.createDataFrame([("a",)], "k string"),
    }
    with ShardReads(spark) as reads:
        for message, df in bad.items():
            with pytest.raises(InvalidUsageError, match=message):
                compute_correction(reads, df, out.url, lower=0, upper=10)
        with pytest.raises(InvalidUsageError, match="empty or reversed"):
            compute_correction(reads, _desired(spark, DESIRED), out.url, lower=10, upper=10)


def test_negative_persisted_multiplicity_is_corruption(spark: Any, tmp_path: Any) -> None:
    out = Shard.create(f"file://{tmp_path}/view", SCHEMA)
    out.append(pa.table({"k": ["a"], "n": [1], "_time": [0], "_diff": [-1]}), lower=0, upper=10)
    with pytest.raises(CorruptionError, match="negative multiplicity -1"), ShardReads(spark) as reads:
        compute_correction(reads, _desired(spark, DESIRED), out.url, lower=10, upper=20).collect()
