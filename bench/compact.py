"""Compaction of unordered parts (issue 20): peak RSS and throughput, against plain pyarrow.

Setup: a local-folder shard holding ``--rows`` updates (default 20M) appended as
``--batches`` batches (default 20) of *unordered* parts (``Shard.stage(order="unordered")``:
the fast ingest path), with the staging bench's row mix (user_id, country, amount, event,
_time) and a few duplicates of ``(row, _time)``.

Two arms, each in a fresh child process (its peak RSS from ``wait4``'s rusage):

* ``compact``: one compaction merging all the batches (``compact`` with a plan that puts
  them in one merge) under ``MergeOptions(memory_budget=--budget)``: sorted runs of the
  budget, spilled to temporary files, then the streaming k-way merge; sorted, consolidated
  output parts.
* ``pyarrow``: ``pq.read_table`` of the same part files, ``sort_by`` the user columns then
  ``_time``, ``pq.write_table`` (no consolidation, unbounded memory): the baseline.

Targets: compaction peak RSS <= 1 GiB; compaction throughput >= 0.5x the baseline's.

    python bench/compact.py                      # 20M rows in 20 batches
    python bench/compact.py --rows 2000000       # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RSS = 1 << 30
TARGET_THROUGHPUT = 0.5
SCHEMA = pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("amount", pa.float64()),
                    ("event", pa.string())])
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "AU", "NL", "SE", "ES", "IT", "MX", "KR", "PL"]
T0 = 1_700_000_000_000
SPAN = 3_600_000  # one hour of event time per batch


def make_batch(rows: int, seed: int, lower: int) -> pa.Table:
    """``rows`` updates in ``[lower, lower + SPAN)``, in random order, ~1% repeated (row, time)s."""
    rng = np.random.default_rng(seed)
    verbs = ["page_view", "add_to_cart", "checkout", "search", "login", "logout", "refund", "share"]
    events = np.array([f"{verbs[i % len(verbs)]}:{i:06d}".ljust(20, "_")[:20] for i in range(5_000)], dtype=object)
    t = pa.table({
        "user_id": pa.array(rng.integers(0, 1_000_000, rows), pa.int64()),
        "country": pa.array(np.array(COUNTRIES, dtype=object)[rng.integers(0, len(COUNTRIES), rows)], pa.string()),
        "amount": pa.array(np.round(rng.gamma(2.0, 20.0, rows), 2), pa.float64()),
        "event": pa.array(events[rng.zipf(1.3, rows) % len(events)], pa.string()),
        "_time": pa.array(lower + rng.integers(0, SPAN, rows), pa.int64()),
    })
    dup = rng.integers(0, rows, rows // 100)
    return pa.concat_tables([t.slice(0, rows - len(dup)), t.take(pa.array(dup))])


def setup(work: Path, rows: int, batches: int) -> str:
    from shardsink import Shard

    url = (work / "shard").as_uri()
    shard = Shard.create(url, SCHEMA, upper=T0)
    per = rows // batches
    for b in range(batches):
        lower = T0 + b * SPAN
        staged = shard.stage(make_batch(per, b, lower), lower=lower, upper=lower + SPAN, desc_id=f"b{b}",
                             order="unordered")
        shard.compare_and_append([staged], expected_upper=lower, new_upper=lower + SPAN, desc_id=f"b{b}")
    return url


def arm_compact(url: str, budget: int) -> dict[str, Any]:
    from shardsink import Shard
    from shardsink.maintenance import CompactOptions, MergeOptions, ScheduleOptions, compact

    shard = Shard.open(url)
    rows = sum(b.rows for b in shard.batches())
    opts = CompactOptions(schedule=ScheduleOptions(min_rows=rows + 1), merge=MergeOptions(memory_budget=budget))
    t0 = time.perf_counter()
    res = compact(shard, options=opts)
    wall = time.perf_counter() - t0
    assert res.applied == 1 and all(p.is_sorted for b in shard.batches() for p in b.parts), res
    m = res.merges[0]
    return {"wall_s": wall, "rows_in": m.rows_in, "rows_out": m.rows_out, "parts_in": m.parts_in,
            "parts_out": m.parts_out, "render": res.render()}


def arm_pyarrow(paths: list[str], out: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    t = pq.read_table(paths)
    t = t.sort_by([(k, "ascending") for k in [*SCHEMA.names, "_time"]])
    pq.write_table(t, out)
    return {"wall_s": time.perf_counter() - t0, "rows": t.num_rows}


def run_child(args: list[str]) -> tuple[dict[str, Any], int]:
    """Run this script as a child with ``args``; its JSON result and its peak RSS (bytes)."""
    p = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE)
    assert p.stdout is not None
    text = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed with exit code {p.returncode}")
    return json.loads(text), usage.ru_maxrss * 1024  # Linux: kilobytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--budget", type=int, default=512 * 1024 * 1024, help="MergeOptions.memory_budget (bytes)")
    ap.add_argument("--arm", choices=["compact", "pyarrow"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm == "compact":
        print(json.dumps(arm_compact(args.url, args.budget)))
        return 0
    if args.arm == "pyarrow":
        print(json.dumps(arm_pyarrow(args.paths, args.out)))
        return 0
    started, load_start = time.perf_counter(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-compact-"))
    try:
        t0 = time.perf_counter()
        url = setup(work, args.rows, args.batches)
        setup_s = time.perf_counter() - t0
        paths = [str(p) for p in sorted((work / "shard" / "parts").rglob("*.parquet"))]
        input_bytes = sum(Path(p).stat().st_size for p in paths)
        print(f"setup: {args.rows:,} rows in {args.batches} unordered batches, {len(paths)} parts, "
              f"{input_bytes / 1e6:.0f} MB ({setup_s:.0f}s)", flush=True)
        base, base_rss = run_child(["--arm", "pyarrow", "--out", str(work / "sorted.parquet"), "--paths", *paths])
        print(f"pyarrow read+sort+write: {base['wall_s']:.1f}s, peak RSS {base_rss / 2**20:.0f} MiB", flush=True)
        ours, rss = run_child(["--arm", "compact", "--url", url, "--budget", str(args.budget)])
        print(f"compaction: {ours['wall_s']:.1f}s, peak RSS {rss / 2**20:.0f} MiB ({ours['render']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    throughput = base["wall_s"] / ours["wall_s"]  # (rows / ours) / (rows / baseline)
    ok_rss, ok_tp = rss <= TARGET_RSS, throughput >= TARGET_THROUGHPUT
    print(f"VERDICT compaction peak RSS = {rss / 2**20:.0f} MiB (target <= {TARGET_RSS / 2**20:.0f} MiB): "
          f"{'MET' if ok_rss else 'MISSED'}")
    print(f"VERDICT compaction throughput / pyarrow read+sort+write = {throughput:.2f} "
          f"(target >= {TARGET_THROUGHPUT}): {'MET' if ok_tp else 'MISSED'}")
    doc = {
        "name": "compact",
        "config": {"rows": args.rows, "batches": args.batches, "memory_budget": args.budget,
                   "python": platform.python_version(), "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "setup_s": setup_s, "input_bytes": input_bytes,
        "compact": {**ours, "peak_rss_bytes": rss},
        "pyarrow": {**base, "peak_rss_bytes": base_rss},
        "ratios": {"throughput_over_pyarrow": throughput},
        "targets": {"peak_rss_bytes": TARGET_RSS, "throughput": TARGET_THROUGHPUT},
        "verdicts": {"peak_rss": ok_rss, "throughput": ok_tp},
        "wall_s": time.perf_counter() - started,
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
    }
    RESULTS.mkdir(exist_ok=True)
    name = "compact.json" if args.rows == 20_000_000 else f"compact@{args.rows}.json"
    (RESULTS / name).write_text(json.dumps(doc, indent=2))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; wrote {RESULTS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
