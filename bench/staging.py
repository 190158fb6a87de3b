"""Staging and snapshot throughput on a local-folder shard, against plain pyarrow.

(a) ``Shard.stage`` of a 1M-row updates table (user_id int64, country low-cardinality
    string, amount float64, event ~20-char string, _time int64) to a local-folder shard,
    versus ``pyarrow.parquet.write_table`` of the same table to a local file (baseline).
    Stage validates, consolidates (sort by user columns then _time, sum duplicate
    (row, _time)), writes Parquet and fsyncs; the baseline only writes. Two extra
    references are printed for context (not the target): write_table + fsync, and
    sort_by + write_table + fsync (the least work the part format itself implies).
    Target: stage / write_table <= 1.3. ``Shard.stage(order="unordered")`` (issue 20: no
    sort, no consolidation; compaction sorts later) is timed beside it: target <= 1.1.
(b) ``Shard.snapshot(as_of)`` of that data committed as 4 batches (4 parts), versus
    ``pyarrow.parquet.read_table`` of the same part files + ``group_by(user columns)
    .aggregate([("_diff", "sum")])``. Target: snapshot / baseline <= 1.5.

Each measurement is the median of 5 runs (3 with --quick), ours and baseline interleaved.

    python bench/staging.py            # 1M rows
    python bench/staging.py --quick    # 200k rows
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink import Shard

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_STAGE = 1.3
TARGET_UNORDERED = 1.1
TARGET_SNAPSHOT = 1.5
TARGET_SNAPSHOT_UNORDERED = 1.2
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "AU", "NL", "SE", "ES", "IT", "MX", "KR", "PL", "CH",
             "BE", "AT", "NO", "DK", "FI", "IE", "PT", "NZ"]
SCHEMA = pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("amount", pa.float64()),
                    ("event", pa.string())])
T0 = 1_700_000_000_000  # ms since the epoch
SPAN = 4 * 3_600_000  # four hours of event time


def make_table(rows: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    verbs = ["page_view", "add_to_cart", "checkout", "search", "login", "logout", "refund", "share"]
    events = np.array([f"{verbs[i % len(verbs)]}:{i:06d}".ljust(20, "_")[:20] for i in range(5_000)], dtype=object)
    return pa.table(
        {
            "user_id": pa.array(rng.integers(0, 100_000, rows), pa.int64()),
            "country": pa.array(np.array(COUNTRIES, dtype=object)[rng.integers(0, len(COUNTRIES), rows)], pa.string()),
            "amount": pa.array(np.round(rng.gamma(2.0, 20.0, rows), 2), pa.float64()),
            "event": pa.array(events[rng.zipf(1.3, rows) % len(events)], pa.string()),
            "_time": pa.array(T0 + rng.integers(0, SPAN, rows), pa.int64()),
        }
    )


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds and process CPU seconds (all threads) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def interleaved(cases: dict[str, Callable[[int], Any]], reps: int) -> tuple[dict[str, list[float]],
                                                                            dict[str, list[float]]]:
    """Run each case ``reps`` times, rotating the order every round; wall and CPU seconds."""
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for i in range(reps):
        for name in names[i % len(names):] + names[: i % len(names)]:
            w, c = timed(lambda fn=cases[name], i=i: fn(i))
            wall[name].append(w)
            cpu[name].append(c)
    return wall, cpu


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_stage(table: pa.Table, work: Path, reps: int) -> dict[str, Any]:
    shard = Shard.create((work / "shard-a").as_uri(), SCHEMA, upper=T0)
    upper = T0 + SPAN
    files = work / "files"
    files.mkdir()

    unordered = Shard.create((work / "shard-u").as_uri(), SCHEMA, upper=T0)

    def stage(i: int) -> None:
        shard.stage(table, lower=T0, upper=upper, desc_id=f"stage-{i}")

    def stage_unordered(i: int) -> None:
        unordered.stage(table, lower=T0, upper=upper, desc_id=f"unordered-{i}", order="unordered")

    def write(i: int) -> None:
        pq.write_table(table, files / f"plain-{i}.parquet")

    def write_fsync(i: int) -> None:
        p = files / f"fsync-{i}.parquet"
        pq.write_table(table, p)
        fsync_file(p)

    def sort_write_fsync(i: int) -> None:
        p = files / f"sorted-{i}.parquet"
        pq.write_table(table.sort_by([(k, "ascending") for k in [*SCHEMA.names, "_time"]]), p)
        fsync_file(p)

    stage(-1)  # warm-up (imports, allocator) for both sides
    stage_unordered(-1)
    write(-1)
    runs, cpu = interleaved({"stage": stage, "stage_unordered": stage_unordered, "write_table": write,
                             "write_table+fsync": write_fsync,
                        "sort_by+write_table+fsync": sort_write_fsync}, reps)
    parts = [p for p in (work / "shard-a" / "parts").rglob("*.parquet")]
    return {
        "runs_s": runs,
        "median_s": {k: med(v) for k, v in runs.items()},
        "best_s": {k: min(v) for k, v in runs.items()},
        "cpu_runs_s": cpu,
        "cpu_median_s": {k: med(v) for k, v in cpu.items()},
        "part_bytes": parts[0].stat().st_size,
        "parts_per_stage": len(parts) // (reps + 1),
        "plain_file_bytes": (files / "plain-0.parquet").stat().st_size,
    }


def bench_snapshot(table: pa.Table, work: Path, reps: int, batches: int = 4) -> dict[str, Any]:
    shard = Shard.create((work / "shard-b").as_uri(), SCHEMA, upper=T0)
    unordered = Shard.create((work / "shard-bu").as_uri(), SCHEMA, upper=T0)
    n = table.num_rows
    step = SPAN // batches
    for b in range(batches):
        piece = table.slice(b * n // batches, (b + 1) * n // batches - b * n // batches)
        lo, hi = T0 + b * step, T0 + (b + 1) * step if b < batches - 1 else T0 + SPAN
        # confine each batch's times to its own interval, keeping the row mix
        times = (piece["_time"].to_numpy() - T0) % (hi - lo) + lo
        piece = piece.set_column(piece.schema.get_field_index("_time"), "_time", pa.array(times))
        shard.append(piece, lower=lo, upper=hi, desc_id=f"batch-{b}")
        staged = unordered.stage(piece, lower=lo, upper=hi, desc_id=f"batch-{b}", order="unordered")
        unordered.compare_and_append([staged], expected_upper=lo, new_upper=hi, desc_id=f"batch-{b}")
    parts = [p for b in shard.batches() for p in b.parts]
    paths = [str(work / "shard-b" / p.key) for p in parts]
    as_of = T0 + SPAN - 1
    keys = SCHEMA.names

    def ours(_: int) -> pa.Table:
        return shard.snapshot(as_of)

    def ours_unordered(_: int) -> pa.Table:
        return unordered.snapshot(as_of)

    def baseline(_: int) -> pa.Table:
        return pq.read_table(paths).group_by(keys).aggregate([("_diff", "sum")])

    got, want = ours(-1), baseline(-1)
    want = want.filter(pc.not_equal(want["_diff_sum"], 0)).rename_columns([*keys, "_count"])
    order = [(k, "ascending") for k in [*keys, "_count"]]
    if not got.sort_by(order).equals(want.select(got.column_names).sort_by(order)):
        raise SystemExit("snapshot differs from the baseline's consolidation")
    if not ours_unordered(-1).sort_by(order).equals(got.sort_by(order)):
        raise SystemExit("the snapshot of unordered parts differs from that of sorted parts")
    runs, cpu = interleaved({"snapshot": ours, "read_table+group_by": baseline,
                             "snapshot_unordered": ours_unordered}, reps)
    return {
        "runs_s": runs,
        "median_s": {k: med(v) for k, v in runs.items()},
        "best_s": {k: min(v) for k, v in runs.items()},
        "cpu_runs_s": cpu,
        "cpu_median_s": {k: med(v) for k, v in cpu.items()},
        "parts": len(parts),
        "part_rows": [p.rows for p in parts],
        "result_rows": got.num_rows,
        "as_of": as_of,
    }


def row(name: str, v: float, ours: float, res: dict[str, Any], ours_name: str, rows: int) -> str:
    best, best_ours, cpu = res["best_s"][name], res["best_s"][ours_name], res["cpu_median_s"][name]
    return (f"    {name:28s}{v * 1e3:9.1f} ms {rows / v / 1e6:6.2f} M rows/s   {ours / v:9.2f}  "
            f"{best * 1e3:6.1f} ms {best_ours / best:9.2f}  {cpu * 1e3:7.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k rows, 3 runs each")
    ap.add_argument("--rows", type=int, help="rows of the updates table (default 1,000,000)")
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    reps = 3 if args.quick else 5
    started = time.perf_counter()
    load_start = os.getloadavg()
    table = make_table(rows)
    print(f"updates table: {rows:,} rows, {table.nbytes / 1e6:.1f} MB in memory, "
          f"{pc.count_distinct(table['event']).as_py()} distinct events; median of {reps}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-staging-"))
    try:
        a = bench_stage(table, work, reps)
        b = bench_snapshot(table, work, reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ma, mb = a["median_s"], b["median_s"]
    ratio_a = ma["stage"] / ma["write_table"]
    ratio_b = mb["snapshot"] / mb["read_table+group_by"]
    print()
    print(f"(a) staging {rows:,} rows to a local folder (part {a['part_bytes'] / 1e6:.1f} MB, "
          f"{a['parts_per_stage']} part(s)); plain file {a['plain_file_bytes'] / 1e6:.1f} MB")
    print(f"    {'':28s}{'median':>9s}    {'rate':>13s}   {'ours/this':>9s}  {'best':>9s} {'ours/this':>9s}"
          f"  {'cpu median':>10s}")
    for k, v in ma.items():
        print(row(k, v, ma["stage"], a, "stage", rows))
    print(f"(b) snapshot of {b['parts']} parts, {rows:,} updates -> {b['result_rows']:,} rows")
    for k, v in mb.items():
        print(row(k, v, mb["snapshot"], b, "snapshot", rows))
    ok_a, ok_b = ratio_a <= TARGET_STAGE, ratio_b <= TARGET_SNAPSHOT
    ratio_u = ma["stage_unordered"] / ma["write_table"]
    ok_u = ratio_u <= TARGET_UNORDERED
    print()
    print(f"VERDICT (a') stage(order='unordered') / write_table = {ratio_u:.2f} (median of {reps}) "
          f"(target <= {TARGET_UNORDERED}): {'MET' if ok_u else 'MISSED'}")
    best_a = a["best_s"]["stage"] / a["best_s"]["write_table"]
    best_b = b["best_s"]["snapshot"] / b["best_s"]["read_table+group_by"]
    print(f"VERDICT (a) stage / write_table = {ratio_a:.2f} (median of {reps}; best-of-{reps} {best_a:.2f}) "
          f"(target <= {TARGET_STAGE}): {'MET' if ok_a else 'MISSED'}")
    ratio_bu = mb["snapshot_unordered"] / mb["snapshot"]
    ok_bu = ratio_bu <= TARGET_SNAPSHOT_UNORDERED
    print(f"VERDICT (b') snapshot of unordered parts / of sorted parts = {ratio_bu:.2f} (median of {reps}) "
          f"(target <= {TARGET_SNAPSHOT_UNORDERED}): {'MET' if ok_bu else 'MISSED'}")
    print(f"VERDICT (b) snapshot / read_table+group_by = {ratio_b:.2f} (median of {reps}; best-of-{reps} "
          f"{best_b:.2f}) (target <= {TARGET_SNAPSHOT}): {'MET' if ok_b else 'MISSED'}")

    doc = {
        "name": "staging",
        "quick": args.quick,
        "config": {"rows": rows, "reps": reps, "statistic": "median", "python": platform.python_version(),
                   "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "stage": a,
        "snapshot": b,
        "ratios": {"stage_over_write_table": ratio_a,
                   "stage_over_write_table_fsync": ma["stage"] / ma["write_table+fsync"],
                   "stage_unordered_over_write_table": ratio_u,
                   "stage_over_sort_write_fsync": ma["stage"] / ma["sort_by+write_table+fsync"],
                   "snapshot_over_read_group_by": ratio_b,
                   "snapshot_unordered_over_sorted": ratio_bu,
                   "best_of_reps": {"stage_over_write_table": a["best_s"]["stage"] / a["best_s"]["write_table"],
                                    "snapshot_over_read_group_by":
                                        b["best_s"]["snapshot"] / b["best_s"]["read_table+group_by"]}},
        "targets": {"stage": TARGET_STAGE, "stage_unordered": TARGET_UNORDERED, "snapshot": TARGET_SNAPSHOT,
                    "snapshot_unordered": TARGET_SNAPSHOT_UNORDERED},
        "verdicts": {"stage": ok_a, "stage_unordered": ok_u, "snapshot": ok_b, "snapshot_unordered": ok_bu},
        "wall_s": time.perf_counter() - started,
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
    }
    RESULTS.mkdir(exist_ok=True)
    name = "staging.json" if rows == 1_000_000 else f"staging@{rows}.json"
    (RESULTS / name).write_text(json.dumps(doc, indent=2))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"wrote {RESULTS / name} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
