"""Updates tables and parts (shardsink.core.updates, .consolidate and .part_io): hostile
input is refused with a message naming the bad value and nothing is written; parts are
consolidated, sorted and split by size."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import InvalidUsageError, Shard
from shardsink.core.consolidate import consolidate
from shardsink.core.part_io import PARALLEL_STAGE_ROWS, read_parts, stage_parts, write_parts
from shardsink.core.updates import user_schema, validate_updates
from shardsink.storage import Blob

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


@pytest.fixture(params=["local"])
def backend(request: pytest.FixtureRequest) -> str:
    """Validation is backend-independent: this module runs on the local folder, except
    the tests marked ``parametrize("backend", BOTH)``, which also run on S3."""
    return str(request.param)


BOTH = ["local", "s3"]




@pytest.fixture
def shard(shard_url: str, blob: Blob) -> Shard:
    """A shard at upper 10 holding one committed row, so 'nothing written' is visible."""
    s = Shard.create(shard_url, SCHEMA, upper=0, blob=blob)
    s.append(pa.table({"k": ["seed"], "v": [0], "_time": [0]}), lower=0, upper=10, desc_id="seed")
    return s


def part_keys(blob: Blob) -> list[str]:
    return sorted(o.key for o in blob.list("parts/"))


def read_part(blob: Blob, key: str) -> pa.Table:
    got = blob.get(key)
    assert got is not None, key
    return pq.read_table(io.BytesIO(got.data))


def good(**overrides: Any) -> pa.Table:
    cols: dict[str, Any] = {
        "k": pa.array(["a", "b"], pa.string()),
        "v": pa.array([1, 2], pa.int64()),
        "_time": pa.array([10, 11], pa.int64()),
        "_diff": pa.array([1, 1], pa.int64()),
    }
    for name, value in overrides.items():
        if value is None:
            del cols[name]
        else:
            cols[name] = value
    return pa.table(cols)


HOSTILE: list[Any] = [
    pytest.param(good(_time=pa.array([10, 25], pa.int64())), 10, 20, r"times \[10, 25\] fall outside the batch "
                 r"bounds \[10, 20\)", id="time-at-or-above-upper"),
    pytest.param(good(_time=pa.array([9, 12], pa.int64())), 10, 20, r"times \[9, 12\] fall outside the batch "
                 r"bounds \[10, 20\)", id="time-below-lower"),
    pytest.param(good(_time=pa.array([10, 20], pa.int64())), 10, 20, r"times \[10, 20\].*\[10, 20\)",
                 id="time-equal-to-upper"),
    pytest.param(good(_diff=pa.array([1, 0], pa.int64())), 10, 20, "'_diff' has 1 zero values", id="zero-diff"),
    pytest.param(good(_time=pa.array([10, None], pa.int64())), 10, 20, "'_time' has 1 null values",
                 id="null-time"),
    pytest.param(good(_diff=pa.array([None, None], pa.int64())), 10, 20, "'_diff' has 2 null values",
                 id="null-diff"),
    pytest.param(good(v=None), 10, 20, r"missing \['v'\]", id="missing-column"),
    pytest.param(good(extra=pa.array([1, 2])), 10, 20, r"unexpected \['extra'\]", id="extra-column"),
    pytest.param(good(_count=pa.array([1, 2])), 10, 20, r"unexpected \['_count'\]", id="count-column"),
    pytest.param(good(v=pa.array(["1", "2"])), 10, 20, "column 'v' has type string; the shard expects int64",
                 id="string-where-int64"),
    pytest.param(good(k=pa.array([1, 2])), 10, 20, "column 'k' has type int64; the shard expects string",
                 id="int-where-string"),
    pytest.param(good(v=pa.array([1.5, 2.0])), 10, 20, "column 'v' has type double", id="float-where-int64"),
    pytest.param(good(_time=None), 10, 20, "no '_time' column", id="missing-time"),
    pytest.param(good(_time=pa.array([10.0, 11.0])), 10, 20, "'_time' has type double", id="float-time"),
    pytest.param(good(_time=pa.array(["10", "11"])), 10, 20, "'_time' has type string", id="string-time"),
    pytest.param(good(_diff=pa.array([1.0, 1.0])), 10, 20, "'_diff' has type double", id="float-diff"),
    pytest.param(good(_time=pa.array([10, 2**63], pa.uint64())), 10, 20, "'_time' has values outside int64",
                 id="uint64-time-overflow"),
    pytest.param(good(_diff=pa.array([1, 2**64 - 1], pa.uint64())), 10, 20, "'_diff' has values outside int64",
                 id="uint64-diff-overflow"),
    pytest.param(good(k=pa.array(["a", "a"]), v=pa.array([1, 1]), _time=pa.array([10, 10]),
                      _diff=pa.array([2**62, 2**62])), 10, 20,
                 f"the appended table has 1 rows whose _diff sum overflows int64, e.g. {2**63}",
                 id="diff-sum-overflow"),
    pytest.param(pa.table([pa.array(["a"]), pa.array([1]), pa.array([2]), pa.array([10])],
                          names=["k", "v", "v", "_time"]), 10, 20, r"duplicate columns \['v'\]",
                 id="duplicate-column"),
    pytest.param(good(), 20, 10, r"\[20, 10\) are empty or reversed", id="reversed-bounds"),
    pytest.param(good(), 10, 10, r"\[10, 10\) are empty or reversed", id="empty-bounds"),
    pytest.param(good(), 10.0, 20, "bounds must be integers", id="float-bound"),
    pytest.param(good(), True, 20, "bounds must be integers", id="bool-bound"),
]


@pytest.mark.parametrize(("table", "lower", "upper", "message"), HOSTILE)
def test_hostile_input_is_refused_naming_the_bad_value_and_nothing_is_written(
    shard: Shard, blob: Blob, table: pa.Table, lower: Any, upper: Any, message: str
) -> None:
    before = (shard.info().seqno, shard.info().upper, part_keys(blob))
    with pytest.raises(InvalidUsageError, match=message) as e:
        shard.append(table, lower=lower, upper=upper, desc_id="hostile")
    assert e.value.exit_code == 2
    after = Shard.open(shard.url, blob=blob).info()
    assert (after.seqno, after.upper, part_keys(blob)) == before
    with pytest.raises(InvalidUsageError, match=message):
        shard.stage(table, lower=lower, upper=upper, desc_id="hostile")
    assert part_keys(blob) == before[2]


@pytest.mark.parametrize("backend", BOTH)
def test_refused_input_writes_nothing_on_either_backend(shard: Shard, blob: Blob) -> None:
    before = (shard.info().seqno, shard.info().upper, part_keys(blob))
    refused = [
        (good(_time=pa.array([10, 25], pa.int64())), 10, 20, "x1"),
        (good(_diff=pa.array([1, 0], pa.int64())), 10, 20, "x2"),
        (good(), 10, 20, "../x"),
        (good(), 20, 10, "x3"),
    ]
    for table, lower, upper, desc_id in refused:
        with pytest.raises(InvalidUsageError):
            shard.append(table, lower=lower, upper=upper, desc_id=desc_id)
    after = Shard.open(shard.url, blob=blob).info()
    assert (after.seqno, after.upper, part_keys(blob)) == before


@pytest.mark.parametrize("desc_id", ["../x", "a/b", "", ".", "..", "x" * 129, "spa ce", "ünïcode", "a\nb"])
def test_bad_desc_id_is_refused_naming_it_and_nothing_is_written(shard: Shard, blob: Blob, desc_id: str) -> None:
    before = (shard.info().seqno, part_keys(blob))
    with pytest.raises(InvalidUsageError, match="description id") as e:
        shard.append(good(), lower=10, upper=20, desc_id=desc_id)
    assert repr(desc_id) in str(e.value)
    with pytest.raises(InvalidUsageError, match="description id"):
        shard.stage(good(), lower=10, upper=20, desc_id=desc_id)
    assert (shard.info().seqno, part_keys(blob)) == before


def test_narrower_compatible_types_are_conformed_to_the_shard_schema(shard: Shard) -> None:
    table = pa.table(
        {"k": pa.array(["a"], pa.large_string()), "v": pa.array([7], pa.int8()), "_time": pa.array([12], pa.int32()),
         "_diff": pa.array([3], pa.int16())}
    )
    shard.append(table, lower=10, upper=20)
    snap = shard.snapshot()
    assert snap.schema.field("v").type == pa.int64()
    assert ("a", 7, 3) in [(r["k"], r["v"], r["_count"]) for r in snap.to_pylist()]


def test_int64_value_that_does_not_fit_a_narrower_shard_column_is_refused(tmp_path: Any) -> None:
    shard = Shard.create(f"file://{tmp_path}/narrow", pa.schema([("small", pa.int8())]))
    with pytest.raises(InvalidUsageError, match="column 'small' does not fit the shard's type int8"):
        shard.append(pa.table({"small": [300], "_time": [0]}), lower=0, upper=1)
    assert sorted(o.key for o in shard._machine.blob.list("parts/")) == []


# --- consolidation and sorting ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BOTH)
def test_parts_are_consolidated_and_sorted(shard: Shard, blob: Blob) -> None:
    table = pa.table(
        {
            "k": pa.array(["b", "a", None, "b", "a", None, "c", "c"], pa.string()),
            "v": pa.array([1, 2, 5, 1, 2, 5, 1, 1], pa.int64()),
            "_time": pa.array([12, 11, 10, 12, 13, 10, 14, 14], pa.int64()),
            "_diff": pa.array([1, 1, 1, 2, 1, 1, 1, -1], pa.int64()),
        }
    )
    staged = shard.stage(table, lower=10, upper=20, desc_id="d1")
    assert len(staged.parts) == 1
    meta = staged.parts[0]
    data = read_part(blob, meta.key)
    assert data.column_names == ["k", "v", "_time", "_diff"]
    rows = [(r["k"], r["v"], r["_time"], r["_diff"]) for r in data.to_pylist()]
    assert rows == [("a", 2, 11, 1), ("a", 2, 13, 1), ("b", 1, 12, 3), (None, 5, 10, 2)]
    got = blob.get(meta.key)
    assert got is not None
    assert (meta.rows, meta.bytes, meta.min_time, meta.max_time) == (4, len(got.data), 10, 13)
    assert meta.key.startswith("parts/d1/") and meta.key.endswith(".parquet")


def test_batch_that_cancels_out_entirely_writes_no_part(shard: Shard, blob: Blob) -> None:
    before = part_keys(blob)
    table = pa.table({"k": ["a", "a"], "v": [1, 1], "_time": [15, 15], "_diff": [1, -1]})
    r = shard.append(table, lower=10, upper=20)
    assert (r.status, r.rows) == ("committed", 0)
    assert part_keys(blob) == before
    assert shard.info().upper == 20


def test_consolidate_sums_per_key_drops_zeros_and_sorts_nulls_last() -> None:
    table = pa.table(
        {"k": pa.array([None, "z", "a", None, "a", "z"], pa.string()), "_time": [1, 2, 3, 1, 3, 2],
         "_diff": [1, 1, 2, 1, -2, 5]}
    )
    out = consolidate(table, ["k", "_time"])
    assert out.column_names == ["k", "_time", "_diff"]
    assert out.to_pylist() == [{"k": "z", "_time": 2, "_diff": 6}, {"k": None, "_time": 1, "_diff": 2}]


def test_consolidate_of_already_consolidated_input_only_sorts() -> None:
    table = pa.table({"k": ["c", "a", "b"], "_time": [1, 1, 1], "_diff": [1, -1, 3]})
    assert consolidate(table, ["k", "_time"]).to_pylist() == [
        {"k": "a", "_time": 1, "_diff": -1}, {"k": "b", "_time": 1, "_diff": 3}, {"k": "c", "_time": 1, "_diff": 1},
    ]


def test_validate_updates_defaults_diff_to_one_and_orders_columns_like_the_schema() -> None:
    out = validate_updates(pa.table({"_time": [5, 6], "v": [1, 2], "k": ["a", "b"]}), SCHEMA, lower=0, upper=None)
    assert out.column_names == ["k", "v", "_time", "_diff"]
    assert out.column("_diff").to_pylist() == [1, 1]
    assert out.schema.field("_time").type == pa.int64()


# --- writing parts ---------------------------------------------------------------------------


def consolidated(n: int) -> pa.Table:
    table = pa.table(
        {"k": pa.array([f"key-{i:04d}" for i in range(n)], pa.string()), "v": pa.array(range(n), pa.int64()),
         "_time": pa.array([i % 7 for i in range(n)], pa.int64()),
         "_diff": pa.array([1 + i % 3 for i in range(n)], pa.int64())}
    )
    return consolidate(validate_updates(table, SCHEMA, lower=0, upper=7), ["k", "v", "_time"])


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("target", [1, 300, 1000])
def test_write_parts_splits_into_several_parts_when_target_bytes_is_small(blob: Blob, target: int) -> None:
    table = consolidated(40)
    metas = write_parts(blob, table, prefix="parts/split", target_bytes=target)
    assert len(metas) == (40 if target == 1 else len(metas)) > 1
    assert sum(m.rows for m in metas) == 40
    assert len({m.key for m in metas}) == len(metas)
    assert part_keys(blob) == sorted(m.key for m in metas)
    for m in metas:
        piece = read_part(blob, m.key)
        assert piece.num_rows == m.rows
        assert (m.min_time, m.max_time) == (min(piece["_time"].to_pylist()), max(piece["_time"].to_pylist()))
    # parts are slices in order: reading them in meta order gives back the table
    back = read_parts(blob, metas, SCHEMA)
    assert back.to_pylist() == table.to_pylist()


def test_write_parts_with_default_target_writes_one_part_and_empty_table_writes_nothing(blob: Blob) -> None:
    assert write_parts(blob, consolidated(0), prefix="parts/empty") == ()
    assert part_keys(blob) == []
    metas = write_parts(blob, consolidated(50), prefix="parts/one")
    assert len(metas) == 1 and metas[0].rows == 50


def test_read_parts_of_no_parts_is_an_empty_table_with_the_full_schema(blob: Blob) -> None:
    out = read_parts(blob, [], SCHEMA)
    assert out.num_rows == 0 and out.column_names == ["k", "v", "_time", "_diff"]


def test_user_schema_strips_reserved_columns() -> None:
    file_schema = pa.schema([("k", pa.string()), ("_time", pa.int64()), ("_diff", pa.int64()), ("_count", pa.int64())])
    assert user_schema(file_schema).names == ["k"]


def test_rows_differing_only_by_nan_are_consolidated_into_one() -> None:
    nan = float("nan")
    t = pa.table({"x": [nan, nan, 1.0], "_time": [5, 5, 5], "_diff": [1, 2, 1]})
    out = consolidate(t, ["x", "_time"])
    assert out.num_rows == 2
    assert sorted(out["_diff"].to_pylist()) == [1, 3]


def test_large_inputs_are_staged_in_parallel_slices_each_consolidated_and_sorted(tmp_path: Path) -> None:
    from shardsink.storage.local import LocalBlob

    n = PARALLEL_STAGE_ROWS + 1000
    keys = [i % 5000 for i in range(n)]  # every key repeats across the whole input
    t = pa.table({"k": pa.array(keys, pa.int64()), "_time": pa.array([0] * n, pa.int64()),
                  "_diff": pa.array([1] * n, pa.int64())})
    blob = LocalBlob(tmp_path / "s")
    written = stage_parts(blob, t, ["k", "_time"], prefix="parts/d")
    total: dict[int, int] = {}
    for p in written:
        piece = read_parts(blob, [p], pa.schema([("k", pa.int64())]))
        ks = piece["k"].to_pylist()
        assert ks == sorted(ks) and len(ks) == len(set(ks))  # each part consolidated and sorted
        for k, d in zip(ks, piece["_diff"].to_pylist(), strict=True):
            total[k] = total.get(k, 0) + d
    assert total == Counter(keys)  # nothing lost or duplicated overall


@pytest.mark.parametrize("seed", range(5))
def test_consolidate_equals_a_sorted_python_reference_with_nulls_and_duplicates(seed: int) -> None:
    import random

    rng = random.Random(seed)
    n = 3000
    ks = [rng.choice([None, "a", "b", "c", "dd"]) for _ in range(n)]
    vs = [rng.choice([None, -1, 0, 7]) for _ in range(n)]
    ts = [rng.randrange(4) for _ in range(n)]
    ds = [rng.choice([-2, -1, 1, 1, 3]) for _ in range(n)]
    t = pa.table({"k": pa.array(ks, pa.string()), "v": pa.array(vs, pa.int64()), "_time": ts, "_diff": ds})
    ref: dict[tuple[object, ...], int] = {}
    for row in zip(ks, vs, ts, ds, strict=True):
        ref[row[:3]] = ref.get(row[:3], 0) + row[3]

    def null_last(x: object) -> tuple[bool, object]:
        return (x is None, x if x is not None else 0)

    expected = sorted(((k, d) for k, d in ref.items() if d != 0), key=lambda kd: tuple(map(null_last, kd[0])))
    out = consolidate(t, ["k", "v", "_time"]).to_pylist()
    assert [((r["k"], r["v"], r["_time"]), r["_diff"]) for r in out] == expected
