"""Cost of reading an evolved shard in Spark (issue 19): native projection per schema id versus
the same rows written under one schema, and versus the Python data source.

Two shards in a local folder hold the same N rows in B batches (one sorted part each):

* ``evolved`` - written under four schema ids, B/4 batches each: ``id int32, user, country,
  amount double``; then ``+ note string``; then ``country -> region``; then ``id -> int64``;
* ``flat``    - the same rows projected onto the final schema, all written under it.

In one SparkSession (local[2]) each reader writes its DataFrame to the ``noop`` sink; every
reader runs once to warm up, then R rounds in rotating order; medians reported (the machine
is shared: ratios are taken within one run), with CPU seconds of the process tree:

* ``changes_flat`` / ``snapshot_flat`` - native reads of ``flat``: the baseline;
* ``changes`` / ``snapshot``           - native reads of ``evolved`` (one scan per schema id,
  projected, ``unionByName``; projected parts always go through the change feed's
  consolidation);
* ``changes_ds`` / ``snapshot_ds``     - the Python data source over ``evolved`` (the fallback).

    python bench/spark_evolved_read.py            # 2M rows, 8 batches, median of 3
    python bench/spark_evolved_read.py --quick    # 400k rows, median of 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import numpy as np
import pyarrow as pa
from proc_cpu import rounds  # bench/ is on sys.path when run as a script

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.spark.read import ShardReads
from shardsink_dev.testing import local_spark

RESULTS = Path(__file__).resolve().parent / "results"
START = pa.schema([("id", pa.int32()), ("user", pa.string()), ("country", pa.string()), ("amount", pa.float64())])
FINAL = pa.schema([("id", pa.int64()), ("user", pa.string()), ("region", pa.string()), ("amount", pa.float64()),
                   ("note", pa.string())])
CHANGES = [SchemaChange(kind="add", name="note", type="string"),
           SchemaChange(kind="rename", name="country", new_name="region"),
           SchemaChange(kind="widen", name="id", type="int64")]


def _batch(b: int, per: int, rng: np.random.Generator) -> dict[str, Any]:
    ids = np.arange(b * per, (b + 1) * per, dtype=np.int32)
    countries = np.array(["de", "fr", "us", "jp", "br", "in", "ng", "au"])
    return {"id": ids, "user": pa.array([f"user-{i % 100_000:06d}" for i in ids]),
            "country": pa.array(countries[rng.integers(0, len(countries), per)]), "amount": rng.random(per) * 100,
            "note": pa.array([f"n{i % 7}" for i in ids]), "_time": np.full(per, b * 1000 + 1, dtype=np.int64),
            "_diff": np.ones(per, dtype=np.int64)}


def build(root: Path, rows: int, batches: int) -> tuple[Shard, Shard]:
    """The evolved shard and its flat twin (module docstring)."""
    evolved = Shard.create(f"file://{root}/evolved", START)
    flat = Shard.create(f"file://{root}/flat", FINAL)
    rng = np.random.default_rng(7)
    per, step = rows // batches, max(1, batches // 4)
    for b in range(batches):
        if b and b % step == 0 and b // step <= len(CHANGES):
            evolved.evolve(CHANGES[b // step - 1])
        cols = _batch(b, per, rng)
        have = evolved.schema
        names = {"region": "country"}
        t = pa.table({f.name: pa.array(cols[names.get(f.name, f.name)]).cast(f.type) for f in have}
                     | {"_time": cols["_time"], "_diff": cols["_diff"]})
        evolved.append(t, lower=b * 1000, upper=(b + 1) * 1000, desc_id=f"b{b}")
        f_cols = {f.name: (pa.nulls(per, f.type) if f.name == "note" and "note" not in have.names
                           else pa.array(cols[names.get(f.name, f.name)]).cast(f.type)) for f in FINAL}
        flat.append(pa.table(f_cols | {"_time": cols["_time"], "_diff": cols["_diff"]}),
                    lower=b * 1000, upper=(b + 1) * 1000, desc_id=f"b{b}")
    return evolved, flat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, help="rows in each shard (default 2,000,000)")
    ap.add_argument("--runs", type=int, help="timed rounds (default 3)")
    args = ap.parse_args()
    rows, runs = (400_000, 2) if args.quick else (2_000_000, 3)
    rows, runs, batches = args.rows or rows, args.runs or runs, 8
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spark-evolved-") as tmp, local_spark("bench-evolved") as spark:
        t0 = time.perf_counter()
        evolved, flat = build(Path(tmp), rows, batches)
        ids = sorted({b.schema_id for b in evolved.batches()})
        print(f"built 2 x {rows:,} rows in {batches} batches (evolved: schema ids {ids}) in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
        upper = batches * 1000

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        with ShardReads(spark, holder="bench") as reads, ShardReads(spark, holder="bench-ds", native="never") as slow:
            assert reads.snapshot(evolved.url).count() == reads.snapshot(flat.url).count() == rows
            frames = {"changes_flat": reads.changes(flat.url, 0, upper),
                      "changes": reads.changes(evolved.url, 0, upper),
                      "changes_ds": slow.changes(evolved.url, 0, upper),
                      "snapshot_flat": reads.snapshot(flat.url), "snapshot": reads.snapshot(evolved.url),
                      "snapshot_ds": slow.snapshot(evolved.url)}
            times, cpu_runs = rounds({k: functools.partial(noop, df) for k, df in frames.items()}, runs)
    secs = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_runs.items()}
    for k in frames:
        base = k.split("_")[0] + "_flat"
        print(f"{k:14s} {secs[k]:6.2f}s  cpu {cpu[k]:6.1f}s  {secs[k] / secs[base]:5.2f}x wall, "
              f"{cpu[k] / cpu[base]:5.2f}x cpu vs {base}   runs {[round(x, 2) for x in times[k]]}")
    load_end = os.getloadavg()
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{load_end[0]:.1f} on {os.cpu_count()} CPUs")
    ratios = {f"{k}_over_{k.split('_')[0]}_flat": {"wall": secs[k] / secs[k.split("_")[0] + "_flat"],
                                                     "cpu": cpu[k] / cpu[k.split("_")[0] + "_flat"]} for k in frames}
    RESULTS.mkdir(exist_ok=True)
    out = {"name": "spark_evolved_read", "rows": rows, "batches": batches, "schema_ids": ids, "runs": runs,
           "statistic": "median", "seconds": secs, "cpu_s": cpu, "runs_s": times, "ratios": ratios,
           "loadavg_1m_start_end": [load_start[0], load_end[0]], "python": sys.version.split()[0],
           "machine": platform.machine()}
    name = "spark_evolved_read.json" if rows == 2_000_000 else f"spark_evolved_read@{rows}.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
