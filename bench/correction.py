"""The materialize sink's correction run vs a full rewrite of the same view, in one Spark session.

Input: a shard of N events (default 1M: id, user_id, kind, amount). View (SQL, 1:1 with
its input minus test events): ``SELECT id, user_id, kind, amount, amount * 0.2 AS tax
FROM events WHERE kind <> 'test'``. After a first full run, each round changes 1% of the
input (N/100 events get a new amount: a retraction and an insertion in one input batch),
then measures

* the correction run: ``refresh_view`` (mint → Spark job: desired - persisted, staged
  from the executors → manifest → compare-and-append), wall time, part bytes and rows
  (updates) it committed;
* the full rewrite: the same view DataFrame (same leased input read) written with
  ``df.write.mode("overwrite").parquet(dir)``, wall time, file bytes and rows.

Targets: correction bytes <= 2% of the rewrite's; correction wall <= 1.0x the rewrite's.
The view is row-wise, so from the second run on each correction is incremental (from the
input's changes alone, :mod:`shardsink.spark.incremental`); each round records the basis
its commit took. For context, one more round forces a full comparison (``full_every=1``:
desired vs persisted over every row) and reports its ratio too (info, not the target).
Finally an unchanged rerun (the input advances with an empty batch) must write 0 bytes.
local[2], the shards and the rewrite on a local folder. Medians over the rounds.

    python bench/correction.py            # 1M input rows, 3 rounds
    python bench/correction.py --quick    # 200k rows, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import numpy as np
import pyarrow as pa
from proc_cpu import tree_cpu  # bench/ is on sys.path when run as a script

from shardsink import Shard
from shardsink.core.shard import AppendResult
from shardsink.sinks.materialize import view
from shardsink.spark.read import ShardReads
from shardsink.spark.view import desired_frame, refresh_view
from shardsink_dev.testing import local_spark

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_BYTES = 0.02
TARGET_WALL = 1.0  # writing 2% of the bytes must not take longer than rewriting everything
SCHEMA = pa.schema([("id", pa.int64()), ("user_id", pa.int64()), ("kind", pa.string()), ("amount", pa.float64())])
SQL = "SELECT id, user_id, kind, amount, amount * 0.2 AS tax FROM events WHERE kind <> 'test'"
KINDS = np.array(["view", "click", "buy", "refund", "test"], dtype=object)
STEP = 10  # each input batch spans 10 ms of shard time


def _events(ids: np.ndarray, rng: np.random.Generator, *, time: int, diff: int,
            amount: np.ndarray | None = None) -> pa.Table:
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "user_id": pa.array(ids % 50_000, pa.int64()),
        "kind": pa.array(KINDS[ids % len(KINDS)], pa.string()),
        "amount": pa.array(amount if amount is not None else np.round(rng.gamma(2.0, 20.0, n), 2), pa.float64()),
        "_time": pa.array(np.full(n, time), pa.int64()),
        "_diff": pa.array(np.full(n, diff), pa.int64()),
    })


def _dir_bytes(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*.parquet")]
    return sum(p.stat().st_size for p in files), len(files)


def _committed_bytes(out: Shard, r: AppendResult) -> tuple[int, int, int]:
    """Part bytes, updates and parts the committed batch of ``r`` holds (0s for an empty batch)."""
    parts = [p for b in out.batches() if b.desc_id == r.desc_id for p in b.parts]
    return sum(p.bytes for p in parts), sum(p.rows for p in parts), len(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k input rows, 2 rounds")
    ap.add_argument("--rows", type=int, help="input rows (default 1,000,000)")
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    rounds = 2 if args.quick else 3
    changed = rows // 100
    rng = np.random.default_rng(7)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-correction-"))
    load_start = os.getloadavg()
    try:
        src = Shard.create((work / "events").as_uri(), SCHEMA)
        out_url = (work / "view").as_uri()
        amounts = np.round(rng.gamma(2.0, 20.0, rows), 2)
        src.append(_events(np.arange(rows), rng, time=0, diff=1, amount=amounts), lower=0, upper=STEP)
        v = view(inputs={"events": src.url}, sql=SQL)
        res: dict[str, Any] = {"rows": rows, "changed_per_round": changed, "rounds": rounds, "view_sql": SQL}
        with local_spark("shardsink-bench-correction") as spark:
            t0 = time.perf_counter()
            first = refresh_view(spark, v, output_url=out_url)
            res["first_run_s"] = time.perf_counter() - t0
            assert isinstance(first, AppendResult)
            out = Shard.open(out_url)
            res["view_rows"] = first.rows
            print(f"input {rows:,} rows; view {first.rows:,} rows; first full run {res['first_run_s']:.1f} s",
                  flush=True)
            per_round = []
            for k in range(1, rounds + 1):
                lower = k * STEP
                ids = rng.choice(rows, changed, replace=False)
                old = amounts[ids]
                amounts[ids] = np.round(old + 1.0, 2)
                batch = pa.concat_tables([_events(ids, rng, time=lower, diff=-1, amount=old),
                                          _events(ids, rng, time=lower, diff=1, amount=amounts[ids])])
                src.append(batch, lower=lower, upper=lower + STEP)

                c0, t0 = tree_cpu(os.getpid()), time.perf_counter()
                r = refresh_view(spark, v, output_url=out_url, run_id=f"round{k}")
                corr_s = time.perf_counter() - t0
                corr_cpu = tree_cpu(os.getpid()) - c0
                assert isinstance(r, AppendResult) and r.upper == lower + STEP
                corr_bytes, corr_rows, corr_parts = _committed_bytes(out, r)
                basis = dict(next(c for _, c in out.log(limit=3) if c.kind == "append").props).get("view.basis")

                target = work / f"overwrite-{k}"
                c0, t0 = tree_cpu(os.getpid()), time.perf_counter()
                with ShardReads(spark) as reads:
                    desired, _ = desired_frame(reads, v, as_of=lower + STEP - 1)
                    desired.write.mode("overwrite").parquet(str(target))
                full_s = time.perf_counter() - t0
                full_cpu = tree_cpu(os.getpid()) - c0
                full_bytes, full_files = _dir_bytes(target)
                full_rows = spark.read.parquet(str(target)).count()
                shutil.rmtree(target)
                per_round.append({"basis": basis, "correction_s": corr_s, "correction_cpu_s": corr_cpu,
                                  "overwrite_cpu_s": full_cpu,
                                  "correction_bytes": corr_bytes,
                                  "correction_updates": corr_rows, "correction_parts": corr_parts,
                                  "overwrite_s": full_s, "overwrite_bytes": full_bytes, "overwrite_rows": full_rows,
                                  "overwrite_files": full_files})
                print(f"round {k}: {basis} correction {corr_s:6.2f} s {corr_bytes:>11,} B {corr_rows:>8,} updates | "
                      f"overwrite {full_s:6.2f} s {full_bytes:>11,} B {full_rows:>9,} rows", flush=True)

            # context: the same change corrected by a full comparison (every row of both sides)
            lower = (rounds + 1) * STEP
            ids = rng.choice(rows, changed, replace=False)
            old = amounts[ids]
            amounts[ids] = np.round(old + 1.0, 2)
            src.append(pa.concat_tables([_events(ids, rng, time=lower, diff=-1, amount=old),
                                         _events(ids, rng, time=lower, diff=1, amount=amounts[ids])]),
                       lower=lower, upper=lower + STEP)
            c0, t0 = tree_cpu(os.getpid()), time.perf_counter()
            r = refresh_view(spark, view(inputs={"events": src.url}, sql=SQL, full_every=1), output_url=out_url,
                             run_id="full")
            res["full_comparison"] = {"seconds": time.perf_counter() - t0, "cpu_s": tree_cpu(os.getpid()) - c0}
            src.append(_events(np.arange(0), rng, time=0, diff=1), lower=(rounds + 2) * STEP,
                       upper=(rounds + 3) * STEP)
            t0 = time.perf_counter()
            r = refresh_view(spark, v, output_url=out_url, run_id="unchanged")
            unchanged_s = time.perf_counter() - t0
            assert isinstance(r, AppendResult)
            u_bytes, u_rows, _ = _committed_bytes(out, r)
            staged = out.writer().list_staged(r.desc_id)
        med = {key: statistics.median(x[key] for x in per_round) for key in per_round[0] if key != "basis"}
        bytes_ratio = med["correction_bytes"] / med["overwrite_bytes"]
        wall_ratio = med["correction_s"] / med["overwrite_s"]
        cpu_ratio = med["correction_cpu_s"] / med["overwrite_cpu_s"] if med["overwrite_cpu_s"] else float("nan")
        res["full_comparison"]["wall_ratio"] = res["full_comparison"]["seconds"] / med["overwrite_s"]
        res["bases"] = [x["basis"] for x in per_round]
        res.update({
            "per_round": per_round, "median": med,
            "bytes_ratio": bytes_ratio, "rows_ratio": med["correction_updates"] / med["overwrite_rows"],
            "wall_ratio": wall_ratio, "cpu_ratio": cpu_ratio,
            "unchanged_rerun": {"seconds": unchanged_s, "bytes": u_bytes, "updates": u_rows,
                                "objects_staged": len(staged)},
            "targets": {"bytes_ratio_max": TARGET_BYTES, "wall_ratio_max": TARGET_WALL},
            "pass": {"bytes": bytes_ratio <= TARGET_BYTES, "wall": wall_ratio <= TARGET_WALL,
                     "unchanged_zero": u_bytes == 0 and u_rows == 0 and not staged},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        })
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian over {rounds} rounds ({changed:,} of {rows:,} input rows changed per round):")
    print(f"  correction run : {med['correction_s']:7.2f} s  {med['correction_bytes']:>12,.0f} B  "
          f"{med['correction_updates']:>10,.0f} updates")
    print(f"  full overwrite : {med['overwrite_s']:7.2f} s  {med['overwrite_bytes']:>12,.0f} B  "
          f"{med['overwrite_rows']:>10,.0f} rows")
    print(f"  bytes ratio    : {bytes_ratio:7.2%}  (target <= {TARGET_BYTES:.0%})  "
          f"{'ok' if res['pass']['bytes'] else 'MISSED'}")
    print(f"  rows ratio     : {res['rows_ratio']:7.2%}")
    wall_ok = "ok" if res["pass"]["wall"] else "MISSED"
    print(f"  wall ratio     : {wall_ratio:7.2f}x (target <= {TARGET_WALL}x)  {wall_ok}")
    print(f"  CPU ratio      : {cpu_ratio:7.2f}x (process tree: driver, Spark JVM, Python workers)")
    print(f"  bases          : {', '.join(res['bases'])}")
    fc = res["full_comparison"]
    print(f"  full comparison: {fc['seconds']:7.2f} s = {fc['wall_ratio']:.2f}x the overwrite (info: full_every=1)")
    un = res["unchanged_rerun"]
    print(f"  unchanged rerun: {un['seconds']:.2f} s, {un['bytes']} bytes, {un['updates']} updates, "
          f"{un['objects_staged']} objects staged  {'ok' if res['pass']['unchanged_zero'] else 'MISSED'}")
    print(f"  load average   : start {load_start[0]:.1f}, end {res['machine']['loadavg_end'][0]:.1f} (2 cores)")
    RESULTS.mkdir(exist_ok=True)
    res["quick"] = args.quick
    res["name"] = "correction"
    name = "correction.json" if rows == 1_000_000 else f"correction@{rows}.json"
    (RESULTS / name).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
