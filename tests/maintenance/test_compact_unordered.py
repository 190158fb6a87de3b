"""Compaction of unordered parts (issue 20): it turns unordered input into sorted, consolidated
output in bounded memory (sorted runs of a memory budget, spilled to temporary files, then
the streaming k-way merge), equal to an independent model; and the plan sorts a lone
unordered batch too."""

from __future__ import annotations

import datetime as dt
import io
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import SCHEMA, Row, audit, changes_counter, consolidated, contents, snapshot_counter, table_of

from shardsink import CorruptionError, Shard
from shardsink.core import state as st
from shardsink.core.consolidate import consolidate
from shardsink.core.part_io import write_parts
from shardsink.maintenance import CompactOptions, MergeOptions, advance_since, compact, merge_parts
from shardsink.maintenance.runs import SORT_FACTOR, row_key
from shardsink.maintenance.schedule import ScheduleOptions, schedule_merges
from shardsink.storage import Blob
from shardsink.storage.local import LocalBlob


def raw(blob: Blob, key: str) -> pa.Table:
    got = blob.get(key)
    assert got is not None, key
    return pq.read_table(io.BytesIO(got.data))


def _messy_rows(seed: int, n: int, lower: int, span: int) -> list[Row]:
    """``n`` updates in random order over few keys: repeated (row, time)s, and retractions each
    of an earlier insert of the same batch at its time or later (never below zero at any time)."""
    rng = random.Random(seed)
    open_inserts: dict[tuple[str, int], list[int]] = {}
    rows: list[Row] = []
    for _ in range(n):
        key = (f"k{rng.randrange(200):03d}", rng.randrange(3))
        times = open_inserts.setdefault(key, [])
        if times and rng.random() < 0.3:
            at = times.pop(rng.randrange(len(times)))
            rows.append((*key, rng.choice([at, rng.randrange(at, lower + span)]), -1))
        else:
            t = lower + rng.randrange(span)
            times.append(t)
            rows.append((*key, t, 1))
    rng.shuffle(rows)
    return rows


def _model_updates(rows: list[Row], since: int) -> list[tuple[str, int, int, int]]:
    """The model's consolidated updates, times advanced to ``since``, sorted (nulls never occur)."""
    c = consolidated((k, n, max(t, since), d) for k, n, t, d in rows)
    return sorted((k, n, t, d) for (k, n, t), d in c.items())


def _as_rows(t: pa.Table) -> list[tuple[str, int, int, int]]:
    return [(r["k"], r["n"], r["_time"], r["_diff"]) for r in t.to_pylist()]


def test_a_merge_of_more_unordered_input_than_the_memory_budget_spills_sorted_runs_and_equals_the_model(
        tmp_path: Path) -> None:
    blob = LocalBlob(tmp_path / "s")
    rows: list[Row] = []
    parts: list[st.PartMeta] = []
    for i in range(6):
        batch = _messy_rows(i, 3_000, lower=100 * i, span=100)
        rows += batch
        parts += write_parts(blob, table_of(batch), prefix=f"parts/u{i}", order="unordered")
    decoded = sum(raw(blob, p.key).nbytes for p in parts)
    budget = decoded // 3  # chunks of budget / SORT_FACTOR: the input needs several runs
    spill = tmp_path / "spill"
    spill.mkdir()
    leftovers: list[list[str]] = []

    def on_batch(i: int, n: int) -> None:
        leftovers.append([p.name for p in spill.iterdir()])

    admin = Shard(blob.url, blob=blob).admin()
    since = 250
    stats = merge_parts(admin, parts, SCHEMA, into=admin.builder("out"), since=since,
                        options=MergeOptions(batch_rows=500, small_bytes=0, memory_budget=budget,
                                             spill_dir=str(spill), row_group_rows=1_000), on_batch=on_batch)
    assert stats.spilled >= 2 and stats.runs >= stats.spilled and stats.streamed
    # Sorting holds one chunk (budget / SORT_FACTOR bytes, plus the batch that filled it); the
    # k-way merge one batch per run and the carry (as for sorted inputs).
    chunk_rows = budget // SORT_FACTOR // max(1, decoded // len(rows)) + 500
    assert stats.peak_rows <= max(2 * chunk_rows, (stats.runs + 2) * 500), (
        f"held {stats.peak_rows} rows at once; a chunk is ~{chunk_rows} rows")
    assert list(spill.iterdir()) == [], "the spill files are removed after the merge"
    assert any(leftovers), "runs were spilled under spill_dir while the inputs were read"
    got = pa.concat_tables([raw(blob, p.key) for p in stats.parts])
    assert _as_rows(got) == _model_updates(rows, since), "the output is the model, sorted and consolidated"
    assert all(p.order == "sorted" for p in stats.parts)
    assert stats.rows_out == got.num_rows < stats.rows_in


@pytest.mark.parametrize("small_bytes", [0, 1 << 30], ids=["streamed", "one-shot"])
def test_a_merge_of_unordered_and_sorted_parts_equals_the_model(tmp_path: Path, small_bytes: int) -> None:
    blob = LocalBlob(tmp_path / "s")
    rows: list[Row] = []
    parts: list[st.PartMeta] = []
    admin = Shard(blob.url, blob=blob).admin()
    for i in range(4):
        batch = _messy_rows(10 + i, 800, lower=50 * i, span=50)
        rows += batch
        if i % 2:
            parts += write_parts(blob, table_of(batch), prefix=f"parts/u{i}", order="unordered")
        else:
            parts += write_parts(blob, consolidate(table_of(batch), ["k", "n", "_time"]), prefix=f"parts/s{i}")
    for budget in (1 << 30, 20_000):
        stats = merge_parts(admin, parts, SCHEMA, into=admin.builder(f"out{budget}"), since=60,
                            options=MergeOptions(batch_rows=128, small_bytes=small_bytes, memory_budget=budget))
        got = pa.concat_tables([raw(blob, p.key) for p in stats.parts])
        assert _as_rows(got) == _model_updates(rows, 60), f"budget {budget}: the output differs from the model"


def test_the_plan_sorts_a_lone_unordered_batch_and_leaves_a_lone_sorted_one() -> None:
    def batch(i: int, order: str) -> st.BatchMeta:
        return st.BatchMeta(f"d{i}", 10 * i, 10 * (i + 1), i + 1,
                            (st.PartMeta(f"parts/d{i}/p.parquet", 1 << 20, 100, 10 * i, 10 * i, order),))

    assert schedule_merges([batch(0, "sorted")], ScheduleOptions()) == []
    lone = batch(0, "unordered")
    assert schedule_merges([lone], ScheduleOptions()) == [(lone,)]


def test_compaction_leaves_only_sorted_parts_and_changes_no_read(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model: dict[str, list[Row]] = {}
    for i in range(5):
        rows = _messy_rows(20 + i, 200, lower=20 * i, span=20)
        order: st.PartOrder = "unordered" if i != 2 else "sorted"
        staged = shard.stage(table_of(rows), lower=20 * i, upper=20 * (i + 1), desc_id=f"d{i}", order=order)
        shard.compare_and_append([staged], expected_upper=20 * i, new_upper=20 * (i + 1), desc_id=f"d{i}")
        model[f"d{i}"] = rows
    advance_since(shard, target=30)
    everything = [r for rows in model.values() for r in rows]
    before = {t: snapshot_counter(shard.snapshot(t)) for t in range(30, 100)}
    feed = changes_counter(shard.changes(30, 100))
    res = compact(shard, options=CompactOptions(merge=MergeOptions(memory_budget=64_000, small_bytes=0)))
    assert res.applied >= 1 and all(m.status == "applied" for m in res.merges)
    assert all(p.is_sorted for b in shard.batches() for p in b.parts), "compaction left an unordered part"
    assert {t: snapshot_counter(shard.snapshot(t)) for t in range(30, 100)} == before
    assert before[99] == contents(everything, 99)
    assert changes_counter(shard.changes(30, 100)) == feed == consolidated(
        (k, n, max(t, 30), d) for k, n, t, d in everything)
    audit(blob, model, url=shard_url)


@pytest.mark.parametrize("seed", range(5))
def test_the_merges_row_keys_order_rows_exactly_as_the_sort_does(seed: int) -> None:
    """The k-way merge cuts each input's sorted rows at the bound by binary search over Python
    row keys: they must order rows exactly as Arrow's sort (nulls last, NaN after numbers)."""
    rng = random.Random(seed)
    n = 300
    t = pa.table({
        "s": pa.array([rng.choice(["", "a", "ab", "b", "é", "z\u00ff", None]) for _ in range(n)], pa.string()),
        "f": pa.array([rng.choice([-1.5, 0.0, 2.0, float("nan"), float("inf"), None]) for _ in range(n)]),
        "ts": pa.array([rng.choice([dt.datetime(1969, 12, 31, 23, 59), dt.datetime(2024, 1, 1), None])
                        for _ in range(n)], pa.timestamp("us", tz="UTC")),
        "b": pa.array([rng.choice([b"\x00", b"\xff", b"a", None]) for _ in range(n)], pa.binary()),
        "_time": pa.array([rng.randrange(3) for _ in range(n)], pa.int64()),
    })
    keys = t.column_names
    want = pc.sort_indices(t, sort_keys=[(k, "ascending", "at_end") for k in keys]).to_pylist()
    got = sorted(range(n), key=lambda j: (row_key(t, j, keys), j))
    assert got == want


def test_sorted_runs_keep_partial_diff_sums_exact(tmp_path: Path) -> None:
    """Unordered inputs sorted in separate runs (a budget of one batch per run): a run whose sum
    of a key leaves int64 keeps its rows (the key's total may not leave it: exact), and a total
    that does leave it fails the merge naming the shard, from several runs or from a lone run
    (whose sums the old merge wrapped: four 2**62 became 0 and the row vanished)."""
    big = 2**62
    blob = LocalBlob(tmp_path / "s")
    admin = Shard(blob.url, blob=blob).admin()

    def merged(inputs: list[list[Row]], name: str) -> list[tuple[str, int, int, int]]:
        parts = [p for i, rows in enumerate(inputs)
                 for p in write_parts(blob, table_of(rows), prefix=f"parts/{name}{i}", order="unordered")]
        stats = merge_parts(admin, parts, SCHEMA, into=admin.builder(name), since=0,
                            options=MergeOptions(small_bytes=0, memory_budget=1 if len(inputs) > 1 else 1 << 30))
        assert stats.runs == len(inputs)
        return _as_rows(pa.concat_tables([raw(blob, p.key) for p in stats.parts])) if stats.parts else []

    assert merged([[("a", 0, 0, big), ("b", 0, 0, 1), ("a", 0, 0, big)],
                   [("a", 0, 0, -big), ("a", 0, 0, 5), ("a", 0, 0, -big)]], "fits") == [("a", 0, 0, 5), ("b", 0, 0, 1)]
    for name, inputs in (("two", [[("a", 0, 0, big)] * 2, [("a", 0, 0, big)] * 2]), ("one", [[("a", 0, 0, big)] * 4])):
        with pytest.raises(CorruptionError, match=f"^compaction of {blob.url} has 1 rows whose _diff sum overflows "
                                                  f"int64, e.g. {2**64}$"):
            merged(inputs, name)
