"""Row-wise views (projections and filters of one input) are corrected in one aggregation
over the input's raw updates (shardsink.spark.linear): the result must equal, row for
row, the general path over the consolidated snapshot and a from-scratch pyarrow
computation. Real Spark (local[2]), both backends."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from shardsink import CorruptionError, Shard
from shardsink.core.shard import AppendResult
from shardsink.errors import ShardNotFoundError
from shardsink.sinks.description import Description
from shardsink.sinks.materialize import mint_view, view
from shardsink.spark.correction import compute_correction
from shardsink.spark.linear import is_row_wise, linear_view_frames
from shardsink.spark.read import ShardReads
from shardsink.spark.view import correct_view, desired_frame, refresh_view, run_view

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("x", pa.float64())])
SQL = "SELECT k, n * 2 AS n2, x FROM events WHERE n <> 0"


def _updates(rows: list[tuple[Any, ...]]) -> pa.Table:
    k, n, x, t, d = (list(c) for c in zip(*rows, strict=True))
    return pa.table({"k": k, "n": n, "x": x, "_time": t, "_diff": d},
                    schema=pa.schema([*SCHEMA, ("_time", pa.int64()), ("_diff", pa.int64())]))


def _x(x: float | None) -> Any:
    return "NaN" if x is not None and x != x else x  # NaN never equals itself as a dict key


def _expected(src: Shard, as_of: int) -> Counter[tuple[Any, ...]]:
    """The view ``SQL`` from scratch over the input's snapshot (pyarrow); ``NULL <> 0`` is not true."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in src.snapshot(as_of).to_pylist():
        if r["n"] is not None and r["n"] != 0:
            out[(r["k"], r["n"] * 2, _x(r["x"]))] += r["_count"]
    return out


def _contents(out: Shard, as_of: int) -> Counter[tuple[Any, ...]]:
    return Counter({(r["k"], r["n2"], _x(r["x"])): r["_count"] for r in out.snapshot(as_of).to_pylist()})


def test_only_projections_and_filters_of_one_input_are_row_wise(spark: Any) -> None:
    probe = spark.createDataFrame([], "k string, n bigint, x double")
    probe.createOrReplaceTempView("events")
    cases = {
        SQL: True,
        "SELECT * FROM events": True,
        "SELECT upper(k) AS k, n FROM events WHERE x > 1.5 AND k IS NOT NULL": True,
        "SELECT k, count(*) AS c FROM events GROUP BY k": False,
        "SELECT DISTINCT k FROM events": False,
        "SELECT k FROM events LIMIT 3": False,
        "SELECT k, rand() AS r FROM events": False,
        "SELECT k FROM events WHERE n > (SELECT avg(n) FROM events)": False,
        "SELECT a.k FROM events a JOIN events b ON a.k = b.k": False,
        "SELECT k, row_number() OVER (ORDER BY n) AS r FROM events": False,
        "SELECT k FROM events UNION ALL SELECT k FROM events": False,
    }
    got = {sql: is_row_wise(spark.sql(sql), probe) for sql in cases}
    assert got == cases


def test_row_wise_view_equals_the_general_path_and_a_from_scratch_computation(spark: Any, shard_url: str) -> None:
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    v = view(inputs={"events": src.url}, sql=SQL)
    src.append(_updates([("a", 1, 1.5, 1, 3), ("b", 0, 2.0, 2, 1), (None, None, None, 3, 2), (None, 3, None, 3, 1),
                         ("c", 4, float("nan"), 4, 1), ("d", 5, -0.0, 5, 1)]), lower=0, upper=10)
    first = refresh_view(spark, v, output_url=out_url)
    assert isinstance(first, AppendResult)
    out = Shard.open(out_url)
    assert _contents(out, 9) == _expected(src, 9)
    # retractions (one row fully, one partly), a multiplicity > 1 change, a new row, a foreign row
    src.append(_updates([("a", 1, 1.5, 12, -2), ("d", 5, -0.0, 13, -1), (None, None, None, 14, 1),
                         (None, 3, None, 14, 2), ("e", 7, 0.25, 15, 2)]), lower=10, upper=20)
    out.append(_updates([("zz", 9, 9.0, 11, 1)]).rename_columns(["k", "n2", "x", "_time", "_diff"]),
               lower=10, upper=15, desc_id="foreign")
    desc = mint_view(v, output_url=out_url, initial_upper=0, interval_end=None, max_span=None,
                     dag_id="t", run_id="r", attempt=1)
    assert isinstance(desc, Description) and (desc.lower, desc.upper) == (15, 20)
    with ShardReads(spark) as reads:
        linear = linear_view_frames(reads, v, as_of=19, run=lambda frames: run_view(spark, v, frames))
        assert linear is not None
        fast = correct_view(reads, v, output_url=out_url, desc=desc).frame
        desired, _ = desired_frame(reads, v, as_of=19)
        general = compute_correction(reads, desired, out_url, lower=15, upper=20)
        fast_rows, general_rows = fast.toArrow().to_pylist(), general.toArrow().to_pylist()
    assert sorted(map(str, fast_rows)) == sorted(map(str, general_rows)) and fast_rows
    second = refresh_view(spark, v, output_url=out_url, run_id="second")
    assert isinstance(second, AppendResult) and second.upper == 20
    assert _contents(out, 19) == _expected(src, 19)
    assert _contents(out, 9) == _expected(src, 9)  # history kept


def test_negative_input_multiplicity_in_a_row_wise_view_is_corruption(spark: Any, tmp_path: Any) -> None:
    src = Shard.create(f"file://{tmp_path}/events", SCHEMA)
    src.append(_updates([("a", 1, 1.0, 1, -1), ("b", 2, 2.0, 2, 1)]), lower=0, upper=10)
    v = view(inputs={"events": src.url}, sql=SQL)
    with pytest.raises(CorruptionError, match=r"input shard .*events as of 9: negative multiplicity -1"):
        refresh_view(spark, v, output_url=f"file://{tmp_path}/view")
    with pytest.raises(ShardNotFoundError):
        Shard.open(f"file://{tmp_path}/view")  # a failed first run creates no output shard
