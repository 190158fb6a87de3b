"""Unordered parts (issue 20: the fast ingest path), on both backends: the builder writes the validated rows as
given, with no sort and no consolidation, records the order in the part metadata, keeps the
per-part statistics; every read over unordered parts (alone or mixed with sorted ones) is
the same as over sorted parts; and the order encodes so that old shards stay readable."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import SCHEMA, Row, audit, changes_counter, consolidated, contents, snapshot_counter, table_of

from shardsink import InvalidUsageError, Shard
from shardsink.core import state as st
from shardsink.core.builder import BatchBuilder, PartOptions
from shardsink.core.documents import ENCODER
from shardsink.core.part_io import PARALLEL_STAGE_ROWS
from shardsink.core.updates import validate_updates
from shardsink.storage import Blob
from shardsink.storage.local import LocalBlob

#: Unsorted, with a (row, time) repeated, an insert and its retraction at one time, and a
#: row at two times: everything a sorted part would have consolidated away.
MESSY: list[Row] = [("b", 1, 12, 1), ("a", 2, 10, 1), ("b", 1, 12, 2), ("c", 0, 11, 1), ("c", 0, 11, -1),
                    ("a", 2, 13, 1), ("a", 1, 10, 1)]


def raw(blob: Blob, key: str) -> pa.Table:
    got = blob.get(key)
    assert got is not None, key
    return pq.read_table(io.BytesIO(got.data))


def rows_of(t: pa.Table) -> list[Row]:
    return [(r["k"], r["n"], r["_time"], r["_diff"]) for r in t.to_pylist()]


def test_unordered_staging_writes_the_rows_as_given_and_keeps_the_part_statistics(shard_url: str,
                                                                                  blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    staged = shard.stage(table_of(MESSY), lower=10, upper=20, desc_id="u1", order="unordered")
    assert [p.order for p in staged.parts] == ["unordered"]
    p = staged.parts[0]
    t = raw(blob, p.key)
    assert rows_of(t) == MESSY, "an unordered part holds the validated rows as given: no sort, no consolidation"
    assert (p.rows, p.min_time, p.max_time) == (len(MESSY), 10, 13)
    got = blob.get(p.key)
    assert got is not None and p.bytes == len(got.data)
    # The sorted path consolidates the same input.
    sorted_parts = shard.stage(table_of(MESSY), lower=10, upper=20, desc_id="s1").parts
    assert all(q.order == "sorted" for q in sorted_parts)
    assert sum(q.rows for q in sorted_parts) < len(MESSY)


def test_unordered_staging_refuses_what_sorted_staging_refuses_and_writes_nothing(shard_url: str,
                                                                                 blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    zero = table_of([("a", 1, 10, 0)])
    with pytest.raises(InvalidUsageError, match="zero"):
        shard.stage(zero, lower=10, upper=20, desc_id="z", order="unordered")
    late = table_of([("a", 1, 25, 1)])
    with pytest.raises(InvalidUsageError, match="outside the batch bounds"):
        shard.stage(late, lower=10, upper=20, desc_id="l", order="unordered")
    with pytest.raises(InvalidUsageError, match="order"):
        shard.stage(table_of(MESSY), lower=10, upper=20, desc_id="o", order="shuffled")  # type: ignore[arg-type]
    assert not list(blob.list("parts/")), "a refused stage writes no part"
    with pytest.raises(ValueError, match="order"):
        PartOptions(order="random")  # type: ignore[arg-type]


def test_an_empty_unordered_stage_writes_no_part(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    assert shard.stage(table_of([]), lower=0, upper=5, desc_id="e", order="unordered").parts == ()
    assert not list(blob.list("parts/"))


def test_large_unordered_inputs_are_cut_into_unordered_slices_that_keep_every_row(tmp_path: Path) -> None:
    n = PARALLEL_STAGE_ROWS + 1000
    t = pa.table({"k": pa.array([f"k{(i * 7919) % 5000}" for i in range(n)], pa.string()),
                  "n": pa.array([i % 3 for i in range(n)], pa.int64()),
                  "_time": pa.array([(i * 31) % 97 for i in range(n)], pa.int64())})
    blob = LocalBlob(tmp_path / "s")
    updates = validate_updates(t, SCHEMA, lower=0, upper=100)
    parts = BatchBuilder(blob, "big", options=PartOptions(order="unordered", threads=2)).stage(updates, [])
    assert len(parts) >= 2 and all(p.order == "unordered" for p in parts)
    back = pa.concat_tables([raw(blob, p.key) for p in parts])
    assert back.num_rows == n == sum(p.rows for p in parts), "no row was consolidated away or lost"
    assert rows_of(back) == rows_of(updates), "the slices keep the input's order"
    for p in parts:
        mm = pc.min_max(raw(blob, p.key)["_time"])
        assert (p.min_time, p.max_time) == (mm["min"].as_py(), mm["max"].as_py())


def test_part_order_is_left_out_when_sorted_and_a_part_without_one_reads_as_sorted() -> None:
    sorted_part = st.PartMeta("parts/d/a.parquet", 3, 100, 1, 2)
    assert b"order" not in ENCODER.encode(sorted_part), "sorted parts encode to the bytes they always had"
    old = b'{"bytes":100,"key":"parts/d/a.parquet","max_time":2,"min_time":1,"rows":3}'
    assert msgspec.json.decode(old, type=st.PartMeta) == sorted_part and sorted_part.is_sorted
    unordered = st.PartMeta("parts/d/b.parquet", 3, 100, 1, 2, "unordered")
    data = ENCODER.encode(unordered)
    assert b'"order":"unordered"' in data and msgspec.json.decode(data, type=st.PartMeta) == unordered
    # An order a newer writer may add reads as not sorted: reads consolidate and compaction sorts it.
    newer = msgspec.json.decode(data.replace(b'"unordered"', b'"by_time"'), type=st.PartMeta)
    assert not newer.is_sorted
    batch = st.BatchMeta("d", 0, 10, 1, (sorted_part, unordered))
    assert batch.order == "unordered" and st.BatchMeta("e", 0, 10, 1, (sorted_part,)).order == "sorted"


def test_reads_over_unordered_and_mixed_parts_equal_the_model(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model: dict[str, list[Row]] = {}
    batches = [("u0", 0, MESSY[:4], ["unordered"]), ("m1", 20, [("a", 2, 21, 1), ("b", 1, 22, -1),
               ("a", 2, 21, 1), ("d", 5, 25, 3)], ["sorted", "unordered"]), ("s2", 40, [("a", 2, 41, -1)], ["sorted"])]
    for desc, lower, rows, orders in batches:
        half = len(rows) // 2 if len(orders) == 2 else len(rows)
        staged = [shard.stage(table_of(rows[:half]), lower=lower, upper=lower + 20, desc_id=desc, order=orders[0])]
        if len(orders) == 2:
            staged.append(shard.stage(table_of(rows[half:]), lower=lower, upper=lower + 20, desc_id=desc,
                                      order=orders[1]))
        shard.compare_and_append(staged, expected_upper=lower, new_upper=lower + 20, desc_id=desc)
        model[desc] = rows
    everything = [r for rows in model.values() for r in rows]
    assert {b.desc_id: b.order for b in shard.batches()} == {"u0": "unordered", "m1": "unordered", "s2": "sorted"}
    for t in range(0, 60):
        assert snapshot_counter(shard.snapshot(t)) == contents(everything, t), f"snapshot({t})"
    for a in range(0, 61, 5):
        for b in range(a, 61, 7):
            assert changes_counter(shard.changes(a, b)) == consolidated(r for r in everything if a <= r[2] < b)
    a = audit(blob, model, url=shard_url)
    assert a.seqno == 3
    assert Counter(p.order for b in shard.batches() for p in b.parts)["unordered"] == 2
