"""Compaction on both backends: merge correctness, refusal and its cleanup, the compaction's
fate, crashes at every step (real process kills), and the bounded-memory streaming merge.

The model is :mod:`support`'s: the audit reads state versions and parts with plain json
and pyarrow, and accepts maintenance commits only if they keep the upper, never move
since back and only remove live batches.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import SCHEMA, Row, audit, changes_counter, consolidated, contents, snapshot_counter, table_of

from shardsink import CorruptionError, Shard
from shardsink.core import fate as ft
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.admin import AdminHandle
from shardsink.core.consolidate import consolidate
from shardsink.core.part_io import read_parts, write_parts
from shardsink.maintenance import (
    CompactOptions,
    Hooks,
    MergeOptions,
    ScheduleOptions,
    advance_since,
    compact,
    compact_batches,
    merge_parts,
    schedule_merges,
    sweep,
)
from shardsink.storage.base import Blob

SPAN = 10


def fill(shard: Shard, n: int, *, first: int = 0, upper: int = 0) -> dict[str, list[Row]]:
    """``n`` appends of SPAN each from ``upper``: new rows, rows seen before at new times,
    and retractions, so merges have something to consolidate."""
    model: dict[str, list[Row]] = {}
    for i in range(first, first + n):
        desc = f"d{i}"
        rows: list[Row] = [(f"k{i}", i, upper + 1, 1), ("same", 0, upper + 2, 1), (f"k{i % 3}", 7, upper, 2)]
        if i % 4 == 3:
            rows.append(("same", 0, upper + 5, -1))  # retracts one of the earlier "same" inserts
        shard.append(table_of(rows), lower=upper, upper=upper + SPAN, desc_id=desc)
        model[desc] = rows
        upper += SPAN
    return model


def reads(shard: Shard, lo: int, hi: int) -> dict[str, Any]:
    return {
        "snapshots": {t: snapshot_counter(shard.snapshot(t)) for t in range(lo, hi)},
        "changes": {(a, b): changes_counter(shard.changes(a, b)) for a in range(lo, hi + 1, 7)
                    for b in range(a, hi + 1, 13)},
    }


def raw(blob: Blob, key: str) -> pa.Table:
    got = blob.get(key)
    assert got is not None, key
    return pq.read_table(pa.BufferReader(got.data))


def _unreferenced(shard: Shard, blob: Blob) -> set[str]:
    """The parts under parts/ that no batch of the head references."""
    return {o.key for o in blob.list("parts/")} - {p.key for b in shard.batches() for p in b.parts}


def assert_part_is_consolidated_and_sorted(t: pa.Table) -> None:
    keys = ["k", "n", "_time"]
    rows = [tuple(r[k] for k in keys) for r in t.select(keys).to_pylist()]
    assert rows == sorted(rows), "a compacted part is not sorted by (row, time)"
    assert len(set(rows)) == len(rows), "a compacted part holds a (row, time) twice"
    assert pc.all(pc.not_equal(t["_diff"], 0)).as_py(), "a compacted part holds a zero diff"


def test_compaction_merges_batches_into_consolidated_sorted_parts_and_changes_no_read(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 12)
    advance_since(shard, target=55)  # times below 55 may now be advanced to 55
    upper = 12 * SPAN
    before = reads(shard, 55, upper)
    res = compact(shard)
    assert res.applied >= 1 and all(m.status == "applied" for m in res.merges)
    assert reads(shard, 55, upper) == before, "compaction changed a snapshot or a change feed at/after since"
    batches = shard.batches()
    assert len(batches) == res.batches_after <= 4, [(b.lower, b.upper, b.rows) for b in batches]
    assert [b.lower for b in batches] == sorted(b.lower for b in batches), "the batch list left time order"
    for b in batches:
        if b.desc_id.startswith("compact-"):
            for p in b.parts:
                t = raw(blob, p.key)
                assert_part_is_consolidated_and_sorted(t)
                assert pc.min(t["_time"]).as_py() >= 55, "a time below since was not advanced"
                assert (p.min_time, p.max_time, p.rows) == (pc.min(t["_time"]).as_py(), pc.max(t["_time"]).as_py(),
                                                            t.num_rows)
    merged_rows = sum(m.rows_in - m.rows_out for m in res.merges)
    assert merged_rows > 0, "nothing consolidated: the test data has duplicates across batches"
    audit(blob, model, url=shard_url)
    # Snapshot and change feed against the independent model too.
    everything = [r for rows in model.values() for r in rows]
    assert snapshot_counter(shard.snapshot(upper - 1)) == contents(everything, upper - 1)
    assert changes_counter(shard.changes(55, upper)) == consolidated(
        (k, n, max(t, 55), d) for k, n, t, d in everything)


def test_live_batches_stay_logarithmic_in_the_number_of_appends() -> None:
    """The plan alone, over 3,000 one-row appends compacted every 50: the live batch count
    never exceeds log2(appends) + 1 right after a compaction."""
    live: list[st.BatchMeta] = []
    worst = 0
    for i in range(3000):
        live.append(st.BatchMeta(f"a{i}", i, i + 1, i, (st.PartMeta(f"p{i}", 1, 10, i, i),)))
        if (i + 1) % 50 == 0:
            for group in schedule_merges(live, ScheduleOptions()):
                at = live.index(group[0])
                rows = sum(b.rows for b in group)
                merged = st.BatchMeta(f"c{i}-{at}", group[0].lower, group[-1].upper, i,
                                      (st.PartMeta(f"c{i}-{at}", rows, 10, group[0].lower, group[-1].upper - 1),))
                live[at:at + len(group)] = [merged]
            worst = max(worst, len(live))
            assert len(live) <= (i + 1).bit_length(), f"{len(live)} live batches after {i + 1} appends"
    assert worst <= 12


def test_refused_compaction_deletes_its_own_output_and_keeps_the_winners(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 4)
    inputs = shard.batches()
    since = shard.info().since
    winner: list[Any] = []

    def rival_wins(cid: str) -> None:  # another compactor merges the same inputs first
        winner.append(compact_batches(Shard(shard_url, blob=blob), inputs, since=since))

    loser = compact_batches(shard, inputs, since=since, options=CompactOptions(hooks=Hooks(after_outputs=rival_wins)))
    assert winner[0].status == "applied" and loser.status == "refused"
    assert loser.deleted == loser.parts_out >= 1
    assert list(blob.list(f"parts/{loser.compaction_id}/")) == [], "the refused compaction's output survived"
    assert list(blob.list(f"staging/{loser.compaction_id}/")) == [], "its manifest survived"
    live = shard.batches()
    assert [b.desc_id for b in live] == [winner[0].compaction_id]
    assert all(blob.get(p.key) is not None for p in live[0].parts), "the winner's parts must stay"
    assert isinstance(shard._machine.head().version.header.committed_seqno(loser.compaction_id), type(None))
    audit(blob, model, url=shard_url)


def test_compaction_fate_is_committed_cannot_commit_or_still_possible_from_one_state_read(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    fill(shard, 4)
    inputs = shard.batches()
    m = shard._machine
    pending = "compact-pending"
    assert isinstance(ft.read_fate(m, pending, 0, inputs=inputs), ft.StillPossible)
    with pytest.raises(ft.DeleteRefusedError):
        ft.delete_staged(m, pending, 0, inputs=inputs)

    first = compact_batches(shard, inputs, since=0)
    fate = ft.read_fate(m, first.compaction_id, 0, inputs=inputs)
    assert isinstance(fate, ft.Committed) and fate.seqno == first.seqno  # via the idempotency window
    out_keys = {p.key for b in shard.batches() for p in b.parts}
    assert fate.keys == out_keys
    assert isinstance(ft.read_fate(m, pending, 0, inputs=inputs), ft.CannotCommit), "an input is gone for good"

    # Push the compaction out of the idempotency window, then compact its output away:
    # the fate is found by locating the version that removed an input.
    fill(shard, tr.RECENT_DESCS + 2, first=4, upper=4 * SPAN)
    assert shard._machine.head().version.header.committed_seqno(first.compaction_id) is None
    assert isinstance(ft.read_fate(m, first.compaction_id, 0, inputs=inputs), ft.Committed)  # output live
    compact_batches(shard, shard.batches()[:2], since=0)
    assert first.compaction_id not in {b.desc_id for b in shard.batches()}
    fate = ft.read_fate(m, first.compaction_id, 0, inputs=inputs)
    assert isinstance(fate, ft.Committed) and fate.keys == out_keys
    assert isinstance(ft.read_fate(m, pending, 0, inputs=inputs), ft.CannotCommit)
    gone = ft.delete_staged(m, first.compaction_id, 0, inputs=inputs)
    assert gone.parts == 0 and all(blob.get(k) is not None for k in out_keys), "a committed output was deleted"


CRASHER = r'''
import os, sys
from shardsink import Shard
from shardsink.maintenance import CompactOptions, Hooks, compact
url, step = sys.argv[1:3]
def die(cid):
    print(cid, flush=True)
    os._exit(9)
compact(Shard(url), options=CompactOptions(hooks=Hooks(**{step: die})))
'''


@pytest.mark.parametrize("step", ["after_manifest", "after_outputs", "after_commit"])
def test_a_killed_compaction_leaves_a_readable_shard_and_its_leftovers_are_swept(
    shard_url: str, blob: Blob, tmp_path: Path, step: str, backend: str
) -> None:
    if backend == "s3" and step != "after_outputs":
        pytest.skip("every step runs on the local backend; S3 repeats the riskiest one (suite time)")
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 6)
    before = reads(shard, 0, 6 * SPAN)
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    p = subprocess.run([sys.executable, str(script), shard_url, step], capture_output=True, timeout=120,
                       env={**os.environ})
    assert p.returncode == 9, p.stderr.decode()[-2000:]
    cid = p.stdout.decode().split()[0]
    fresh = Shard(shard_url, blob=blob)
    assert reads(fresh, 0, 6 * SPAN) == before, "a killed compaction changed what readers see"
    audit(blob, model, url=shard_url)
    applied = step == "after_commit"
    assert (cid in {b.desc_id for b in fresh.batches()}) == applied

    assert sweep(fresh, grace_s=3600) == [], "the sweep touched a leftover younger than the grace period"
    if not applied:
        # Its inputs are live: it may still apply, so nothing of it may go yet.
        assert [s.fate for s in sweep(fresh, grace_s=0)] == []
        res = compact(fresh)  # replaces the inputs: the crashed compaction can never apply now
        assert res.applied >= 1
    swept = sweep(fresh, grace_s=0)
    assert [(s.compaction_id, s.fate) for s in swept] == [(cid, "Committed" if applied else "CannotCommit")]
    assert list(blob.list(f"staging/{cid}/")) == []
    outputs = [o.key for o in blob.list(f"parts/{cid}/")]
    if applied:
        assert outputs and all(k in {p.key for b in fresh.batches() for p in b.parts} for k in outputs)
    else:
        assert outputs == [], "the crashed compaction's output was not swept"
    a = audit(blob, model, url=shard_url)
    compacted_away = {p["key"] for v in a.versions for b in v["added"] for p in b["parts"]} - a.referenced
    assert a.leaked <= compacted_away, f"parts nobody ever referenced remain: {a.leaked - compacted_away}"
    assert reads(fresh, 0, 6 * SPAN) == before


def _admin(blob: Blob) -> AdminHandle:
    """The maintenance handle over ``blob`` (no shard state needed to merge parts)."""
    return Shard(blob.url, blob=blob).admin()


def _parts_of(blob: Blob, n_inputs: int, rows: int, *, row_group_rows: int | None = None) -> list[st.PartMeta]:
    """Sorted, consolidated parts with overlapping keys, equal keys at several times (which
    advancing to since makes equal), and retractions that cancel across parts; written in
    row groups of ``row_group_rows`` like compacted parts (None: one row group, like appends)."""
    out = []
    for i in range(n_inputs):
        ks = [f"k{j:06d}" for j in range(rows)]
        t = pa.table({
            "k": pa.array(ks, pa.string()),
            "n": pa.array([j % 3 for j in range(rows)], pa.int64()),
            "_time": pa.array([(j * 7 + i * 13) % 1000 for j in range(rows)], pa.int64()),
            "_diff": pa.array([(-1 if (i == 1 and j % 5 == 0) else 1) for j in range(rows)], pa.int64()),
        })
        t = consolidate(t, ["k", "n", "_time"])
        if row_group_rows is None:
            out.extend(write_parts(blob, t, prefix=f"parts/in{i}"))
            continue
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=row_group_rows)
        key = f"parts/in{i}/p.parquet"
        blob.put(key, buf.getvalue())
        out.append(st.PartMeta(key, t.num_rows, len(buf.getvalue()), pc.min(t["_time"]).as_py(),
                               pc.max(t["_time"]).as_py()))
    return out


def test_streaming_merge_reads_inputs_batch_by_batch_in_bounded_memory(blob: Blob) -> None:
    n_inputs, rows, batch_rows, since = 4, 20_000, 500, 500
    parts = _parts_of(blob, n_inputs, rows, row_group_rows=1_000)
    reads_seen: list[tuple[int, int]] = []
    base = pa.total_allocated_bytes()
    peak = [0]

    def on_batch(i: int, n: int) -> None:
        reads_seen.append((i, n))
        peak[0] = max(peak[0], pa.total_allocated_bytes() - base)

    adm = _admin(blob)
    stats = merge_parts(adm, parts, SCHEMA, into=adm.builder("out"), since=since,
                        options=MergeOptions(batch_rows=batch_rows, part_bytes=256 * 1024, small_bytes=0,
                                             row_group_rows=1_000),
                        on_batch=on_batch)
    assert stats.streamed and stats.rows_in == n_inputs * rows
    assert max(n for _, n in reads_seen) <= batch_rows, "an input was read in more than one batch at once"
    assert sum(n for _, n in reads_seen) == n_inputs * rows and len(reads_seen) >= n_inputs * rows // batch_rows
    assert stats.peak_rows <= (n_inputs + 2) * batch_rows, f"held {stats.peak_rows} rows at once"
    full = read_parts(blob, parts, SCHEMA)
    whole = full.nbytes
    assert peak[0] < whole / 2, f"merge held {peak[0]} bytes of Arrow memory; inputs decode to {whole}"
    # Same result as consolidating everything at once, in sorted, consolidated parts.
    expected = consolidate(full.set_column(2, full.schema.field(2),
                                              pc.max_element_wise(full["_time"], pa.scalar(since, pa.int64()))),
                              ["k", "n", "_time"])
    got = pa.concat_tables([raw(blob, p.key) for p in stats.parts])
    assert len(stats.parts) > 1, "expected the output cut into several parts"
    assert_part_is_consolidated_and_sorted(got)  # across parts too: the stream is globally sorted
    assert got.to_pylist() == expected.to_pylist()
    assert got.num_rows < stats.rows_in, "since advancement and retractions must have consolidated rows"
    groups = [pq.ParquetFile(pa.BufferReader(blob.get(p.key).data)).metadata  # type: ignore[union-attr]
              for p in stats.parts]
    assert max(m.row_group(i).num_rows for m in groups for i in range(m.num_row_groups)) <= 1_000, (
        "outputs must be written in small row groups, so that merging them later streams too")


def test_one_shot_and_streaming_merges_write_the_same_updates(blob: Blob) -> None:
    parts = _parts_of(blob, 3, 2_000)
    streaming = MergeOptions(batch_rows=64, small_bytes=0)
    adm = _admin(blob)
    a = merge_parts(adm, parts, SCHEMA, into=adm.builder("a"), since=300, options=streaming)
    b = merge_parts(adm, parts, SCHEMA, into=adm.builder("b"), since=300, options=MergeOptions())
    assert a.streamed and not b.streamed
    ta = pa.concat_tables([raw(blob, p.key) for p in a.parts])
    tb = pa.concat_tables([raw(blob, p.key) for p in b.parts])
    assert ta.to_pylist() == tb.to_pylist()


def test_compacted_part_is_plain_parquet(blob: Blob) -> None:
    """Readers need nothing special: an output part round-trips through plain pyarrow."""
    parts = _parts_of(blob, 2, 50)
    adm = _admin(blob)
    stats = merge_parts(adm, parts, SCHEMA, into=adm.builder("p"), since=0)
    got = blob.get(stats.parts[0].key)
    assert got is not None
    assert pq.read_table(io.BytesIO(got.data)).schema.names == ["k", "n", "_time", "_diff"]


def test_inputs_replaced_and_collected_while_read_is_a_refusal_not_corruption(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    model = fill(shard, 4)
    inputs = shard.batches()

    def rival_wins_and_gc_collects(cid: str) -> None:
        compact_batches(Shard(shard_url, blob=blob), inputs, since=0)
        for b in inputs:  # what GC may do to parts no retained version references any more
            for p in b.parts:
                blob.delete(p.key)

    loser = compact_batches(shard, inputs, since=0,
                            options=CompactOptions(hooks=Hooks(after_manifest=rival_wins_and_gc_collects)))
    assert loser.status == "refused"
    assert list(blob.list(f"parts/{loser.compaction_id}/")) == [] == list(blob.list(f"staging/{loser.compaction_id}/"))
    everything = [r for rows in model.values() for r in rows]
    assert snapshot_counter(shard.snapshot(4 * SPAN - 1)) == contents(everything, 4 * SPAN - 1)



@pytest.mark.parametrize("small_bytes", [1 << 30, 0], ids=["one-shot", "streamed"])
def test_a_compaction_never_writes_a_wrapped_diff_sum(shard_url: str, blob: Blob, small_bytes: int) -> None:
    """Six batches adding ("a", 0) with diffs 2**62 (+, +, -, +, +, +), times advanced to one
    since: the sum 2**64 wrapped to 0 and the compaction dropped the row. Now it refuses
    (CorruptionError naming the shard and the sum) and commits nothing; the first three
    (2**63 on the way, 2**62 at the end) compact exactly."""
    big = 2**62
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    for i, d in enumerate((big, big, -big, big, big, big)):
        shard.append(table_of([("a", 0, SPAN * i, d), ("b", 0, SPAN * i, 1)]), lower=SPAN * i, upper=SPAN * (i + 1))
    since = 5 * SPAN
    advance_since(shard, target=since)
    head = shard.reader().head()
    options = CompactOptions(merge=MergeOptions(small_bytes=small_bytes, batch_rows=1))
    with pytest.raises(CorruptionError, match=f"^compaction of {re.escape(shard_url)} has 1 rows whose _diff sum "
                                              f"overflows int64, e.g. {2**64}$"):
        compact_batches(shard, shard.batches(), since=since, options=options)
    after = shard.reader().head()
    assert (after.seqno, shard.batches()) == (head.seqno, shard.reader().batches(head)), "nothing was committed"
    if small_bytes:
        assert _unreferenced(shard, blob) == set(), "the one-shot merge wrote no output part"
    res = compact_batches(shard, shard.batches()[:3], since=since, options=options)
    assert res.status == "applied"
    merged = shard.batches()[0]
    got = read_parts(blob, merged.parts, SCHEMA).sort_by("k").to_pylist()
    assert got == [{"k": "a", "n": 0, "_time": since, "_diff": big}, {"k": "b", "n": 0, "_time": since, "_diff": 3}]


@pytest.mark.parametrize("failure", ["overflow", "crash-mid-merge"])
def test_a_merge_that_fails_before_its_commit_leaves_no_output_nor_manifest(shard_url: str, blob: Blob,
                                                                            failure: str) -> None:
    """A merge that fails after writing output parts (a _diff sum outside int64 at the last key,
    or any error mid-merge) deletes its manifest and those parts: its inputs stay live, so the
    fate rule calls it StillPossible and neither the sweep nor GC would ever take them (one more
    set per retry). Nothing is committed and the inputs stay readable."""
    big = 2**62
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    n = 3 if failure == "overflow" else 1  # three 2**62 adds at one since: 3 * 2**62 leaves int64
    for i in range(3):
        rows: list[Row] = [(f"k{j:02d}", 0, SPAN * i, 1) for j in range(20)]
        rows.append(("z", 0, SPAN * i, big if i < n else 1))
        shard.append(table_of(rows), lower=SPAN * i, upper=SPAN * (i + 1))
    advance_since(shard, target=2 * SPAN)
    head = shard.reader().head()
    read = (lambda: snapshot_counter(shard.snapshot(3 * SPAN - 1))) if failure != "overflow" else shard.batches
    before = read()  # the overflowing sum fails reads too: then the batches and their parts must stay
    cids: list[str] = []
    written: list[int] = []

    def on_batch(i: int, rows: int) -> None:
        written.append(len(list(blob.list(f"parts/{cids[0]}/"))))
        if failure == "crash-mid-merge" and len(written) > 30:
            raise RuntimeError("simulated failure mid-merge")

    options = CompactOptions(merge=MergeOptions(small_bytes=0, batch_rows=1, part_bytes=1, row_group_rows=1),
                             hooks=Hooks(after_manifest=cids.append, on_batch=on_batch))
    with pytest.raises(CorruptionError if failure == "overflow" else RuntimeError,
                       match="overflows int64" if failure == "overflow" else "simulated"):
        compact_batches(shard, shard.batches(), since=2 * SPAN, options=options)
    (cid,) = cids
    assert max(written) > 0, "the merge wrote no output part before it failed: the test proves nothing"
    assert list(blob.list(f"parts/{cid}/")) == [] == list(blob.list(f"staging/{cid}/")), "leftovers remain"
    after = shard.reader().head()
    assert (after.seqno, shard.batches()) == (head.seqno, shard.reader().batches(head)), "nothing was committed"
    assert _unreferenced(shard, blob) == set() and sweep(shard, grace_s=0) == []
    assert all(blob.get(p.key) is not None for b in shard.batches() for p in b.parts)
    assert read() == before
