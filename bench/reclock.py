"""Reclocking overhead: file arrivals (reclocked) vs the landing-zone source on the same data.

Both ingest the same files (one folder on S3 served by moto, over real HTTP through a
request-counting proxy; shards on the same S3) in the same Spark session (local[2]):

* baseline: ``LandingSource`` (event-time column + ``_watermark.json``);
* ours: ``FileArrivals`` (no watermark; bindings minted in a remap shard).

Each round lands ``--files`` new files, then runs one uncontended ingest run per source
(mint → every writer slot's read/stage/manifest → append, the library calls the Airflow
tasks and the spark-submit job make) and counts the S3 requests (all of them: driver and
executors) and the wall time of each. Targets (issue): at most +4 store requests and at
most +1 s per run vs the baseline. Prints medians, ratios, the load average, and writes
bench/results/reclock.json.

    python bench/reclock.py            # 5 rounds of 6 files x 20k rows
    python bench/reclock.py --quick    # 3 rounds of 3 files x 2k rows
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "reclock")]
RESULTS = Path(__file__).resolve().parent / "results"
DAY = 86_400_000
START = 1_704_067_200_000
TARGET_REQUESTS, TARGET_SECONDS = 4, 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--slots", type=int, default=2)
    a = ap.parse_args()
    rounds = a.rounds or (3 if a.quick else 5)
    files = a.files or (3 if a.quick else 6)
    rows = a.rows or (2_000 if a.quick else 20_000)

    from support.faultproxy import fault_proxy

    from shardsink_dev.testing import local_spark, moto_server

    with moto_server() as moto:
        moto.make_bucket("bench")
        os.environ.update(moto.env())
        with fault_proxy(moto.endpoint) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.url  # executors too: Spark starts after this
            with local_spark("bench-reclock") as spark:
                result = run(spark, proxy, rounds=rounds, files=files, rows=rows, slots=a.slots)
    report(result, rounds=rounds, files=files, rows=rows)


def land_round(root: str, r: int, files: int, rows: int) -> None:
    import pyarrow as pa

    from shardsink_dev.synthetic import land_file, publish_watermark

    for i in range(files):
        base = (r * files + i) * rows
        t = pa.table({"id": pa.array(range(base, base + rows), pa.int64()),
                      "v": [f"v{j % 97}" for j in range(rows)],
                      "event_time": pa.array([START + r * DAY + (j % DAY) for j in range(rows)], pa.int64())})
        land_file(root, f"r{r:03d}/f{i}.parquet", t)
    publish_watermark(root, START + (r + 1) * DAY)


def one_run(spark: Any, proxy: Any, shard_url: str, source: Any, *, interval_end: int, slots: int) -> dict[str, Any]:
    from rc_helpers import run_once

    proxy.wait_idle()
    proxy.clear()
    t0 = time.perf_counter()
    run_once(spark, shard_url, source, interval_end=interval_end, slots=slots)
    wall = time.perf_counter() - t0
    proxy.wait_idle()
    reqs = proxy.requests()
    kinds = Counter(f"{q.method} {classify(q.key)}" for q in reqs)
    return {"seconds": round(wall, 3), "requests": len(reqs), "by_kind": dict(sorted(kinds.items()))}


def classify(key: str) -> str:
    for part in ("remap/state", "remap/parts", "remap/health", "state/", "parts/", "staging/", "landing/",
                 "reclock.json"):
        if part in key:
            return part.rstrip("/")
    return "other"


def run(spark: Any, proxy: Any, *, rounds: int, files: int, rows: int, slots: int) -> dict[str, Any]:
    import pyarrow as pa

    from shardsink.sources.files import FileArrivals
    from shardsink.sources.landing import LandingSource

    pre = f"s3://bench/{uuid.uuid4().hex[:8]}"
    root = f"{pre}/landing"
    landing = LandingSource(root, time_column="event_time",
                            schema=pa.schema([("id", pa.int64()), ("v", pa.string())]))
    arrivals = FileArrivals(root, remap=f"{pre}/reclocked-remap", settle_seconds=0,
                            schema=pa.schema([("id", pa.int64()), ("v", pa.string()), ("event_time", pa.int64())]))
    out: dict[str, list[dict[str, Any]]] = {"landing": [], "reclocked": []}
    for r in range(rounds):
        land_round(root, r, files, rows)
        end = START + (r + 1) * DAY
        out["landing"].append(one_run(spark, proxy, f"{pre}/landing-shard", landing, interval_end=end, slots=slots))
        out["reclocked"].append(one_run(spark, proxy, f"{pre}/reclocked", arrivals, interval_end=end, slots=slots))
        print(f"round {r}: landing {out['landing'][-1]['requests']} req {out['landing'][-1]['seconds']} s; "
              f"reclocked {out['reclocked'][-1]['requests']} req {out['reclocked'][-1]['seconds']} s", flush=True)
    return out


def report(result: dict[str, Any], *, rounds: int, files: int, rows: int) -> None:
    steady = {k: v[1:] or v for k, v in result.items()}  # round 0 also creates the shards
    med = {k: {"requests": statistics.median(x["requests"] for x in v),
               "seconds": statistics.median(x["seconds"] for x in v)} for k, v in steady.items()}
    extra_req = med["reclocked"]["requests"] - med["landing"]["requests"]
    extra_s = med["reclocked"]["seconds"] - med["landing"]["seconds"]
    load = os.getloadavg()
    summary = {
        "bench": "reclock", "baseline": "landing-zone source (watermark), same files, same session",
        "rounds": rounds, "files_per_round": files, "rows_per_file": rows,
        "median_steady": med, "extra_requests_per_run": extra_req, "extra_seconds_per_run": round(extra_s, 3),
        "ratio_requests": round(med["reclocked"]["requests"] / med["landing"]["requests"], 3),
        "ratio_seconds": round(med["reclocked"]["seconds"] / med["landing"]["seconds"], 3),
        "targets": {"extra_requests": TARGET_REQUESTS, "extra_seconds": TARGET_SECONDS},
        "met": {"requests": extra_req <= TARGET_REQUESTS, "seconds": extra_s <= TARGET_SECONDS},
        "runs": result, "loadavg": load, "machine": platform.platform(), "cpus": os.cpu_count(),
    }
    print(f"landing (baseline): {med['landing']['requests']} requests, {med['landing']['seconds']:.2f} s per run")
    print(f"reclocked (ours):   {med['reclocked']['requests']} requests, {med['reclocked']['seconds']:.2f} s per run")
    print(f"extra: {extra_req:+} requests (target <= {TARGET_REQUESTS}), {extra_s:+.2f} s (target <= "
          f"{TARGET_SECONDS}); ratio ours/baseline: requests {summary['ratio_requests']}, "
          f"seconds {summary['ratio_seconds']}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("by kind (last round):", json.dumps({k: v[-1]["by_kind"] for k, v in result.items()}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "reclock.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
