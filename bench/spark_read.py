"""Read throughput: the leased read helpers and the ``shardsink`` data source versus native Spark.

One shard in a local folder holds N rows (id bigint, user string, country string,
amount double) in B batches of one part each. In one SparkSession (local[2]), each
reader scans every column of those same part files into the ``noop`` sink (all rows
materialised, nothing written); every reader runs once to warm up, then R rounds in
rotating order, and the median of each is reported (the machine is shared: ratios are
taken within one run). DataFrames are created once where the reader allows (Parquet
listing and the shard's state are read at creation):

* ``parquet``        - ``spark.read.parquet(<the part files>)`` (Spark's vectorised reader): baseline;
* ``changes``        - ``ShardReads.changes`` (leased, consolidated change feed; natively planned on
  a local folder): the same columns and rows plus ``_time``/``_diff``. Target: rows/s >= 0.9 x parquet;
  ``changes_leased`` is ``read_changes`` taking its lease and planning on every call;
* ``changes_ds``     - the Python data source, ``format("shardsink").option("mode", "changes")``
  (what non-native stores use), for reference;
* ``parquet_groupby`` - ``spark.read.parquet(parts).groupBy(all columns).agg(sum(_diff))``: the
  native group-by, baseline of
* ``snapshot``       - ``ShardReads.snapshot`` (leased, consolidated). Target: <= 1.2 x parquet_groupby
  time; ``snapshot_leased`` is ``read_snapshot`` per call.

    python bench/spark_read.py                 # 5M rows, 8 batches, median of 3
    python bench/spark_read.py --rows 50000000 # 10x
    python bench/spark_read.py --quick         # 1M rows, 4 batches, median of 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import numpy as np
import pyarrow as pa
from proc_cpu import rounds  # bench/ is on sys.path when run as a script
from pyspark.sql import functions as F

from shardsink import Shard
from shardsink.core.consolidate import consolidate
from shardsink.core.shard import StagedBatch
from shardsink.core.updates import TIME, validate_updates
from shardsink.spark import datasource as ds
from shardsink.spark.read import ShardReads, read_changes, read_snapshot
from shardsink_dev.testing import local_spark

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_CHANGES = 0.9
TARGET_SNAPSHOT = 1.2
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("country", pa.string()), ("amount", pa.float64())])


def build(root: Path, rows: int, batches: int) -> tuple[Shard, list[str]]:
    shard = Shard.create(f"file://{root}/events", SCHEMA)
    rng = np.random.default_rng(7)
    per = rows // batches
    countries = np.array(["de", "fr", "us", "jp", "br", "in", "ng", "au"])
    for b in range(batches):
        ids = np.arange(b * per, (b + 1) * per, dtype=np.int64)
        t = pa.table({
            "id": ids,
            "user": pa.array([f"user-{i % 100_000:06d}" for i in ids]),
            "country": pa.array(countries[rng.integers(0, len(countries), per)]),
            "amount": rng.random(per) * 100,
            "_time": np.full(per, b * 1000 + 1, dtype=np.int64),
        })
        # One part per batch, as the module docstring says (Shard.append would cut a big
        # batch into one part per core, as several Spark tasks would).
        desc = f"b{b}"
        updates = validate_updates(t, SCHEMA, lower=b * 1000, upper=(b + 1) * 1000)
        parts = shard.writer().builder(desc).write_consolidated(consolidate(updates, [*SCHEMA.names, TIME]))
        staged = StagedBatch(desc, b * 1000, (b + 1) * 1000, parts)
        shard.compare_and_append([staged], expected_upper=b * 1000, new_upper=(b + 1) * 1000, desc_id=desc)
    files = [f"{root}/events/{p.key}" for bt in shard.batches() for p in bt.parts]
    return shard, files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, help="rows in the shard (default 5,000,000)")
    ap.add_argument("--runs", type=int, help="timed rounds (default 3)")
    args = ap.parse_args()
    rows, batches, runs = (1_000_000, 4, 2) if args.quick else (5_000_000, 8, 3)
    rows = args.rows or rows
    batches = max(batches, rows // 625_000)  # parts of ~625k rows, as at the default size
    runs = args.runs or runs
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spark-read-") as tmp, local_spark("bench-spark-read") as spark:
        t0 = time.perf_counter()
        shard, files = build(Path(tmp), rows, batches)
        print(f"built {rows:,} rows in {batches} parts ({sum(Path(f).stat().st_size for f in files) / 2**20:.1f} MiB"
              f" Parquet) in {time.perf_counter() - t0:.1f}s", flush=True)
        ds.register(spark)
        upper = batches * 1000
        keys = SCHEMA.names

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        def snapshot_leased() -> None:
            with read_snapshot(spark, shard.url) as df:
                noop(df)

        def changes_leased() -> None:
            with read_changes(spark, shard.url, 0, upper) as df:
                noop(df)

        parquet = spark.read.parquet(*files)  # listing and footers: planned once, like the helpers below
        grouped = parquet.groupBy(*keys).agg(F.sum("_diff").alias("_count"))
        changes_ds = (spark.read.format("shardsink").option("minPartitions", "2").option("mode", "changes")
                      .option("from", "0").option("to", str(upper)).load(shard.url))
        # The helpers' DataFrames are planned once too, inside one leased block (as a job that
        # runs several actions would); *_leased take a lease and plan on every call.
        with ShardReads(spark, holder="bench") as reads:
            changes = reads.changes(shard.url, 0, upper)
            snapshot = reads.snapshot(shard.url)
            readers: dict[str, Callable[[], None]] = {
                "parquet": lambda: noop(parquet),
                "changes": lambda: noop(changes),
                "changes_leased": changes_leased,
                "changes_ds": lambda: noop(changes_ds),
                "parquet_groupby": lambda: noop(grouped),
                "snapshot": lambda: noop(snapshot),
                "snapshot_leased": snapshot_leased,
            }
            # CPU: seconds of this process and its children (the Spark JVM, its Python workers) per run
            times, cpu_runs = rounds(readers, runs)
    secs = {name: statistics.median(v) for name, v in times.items()}
    rate = {name: rows / s for name, s in secs.items()}
    for name in readers:
        print(f"{name:16s} {secs[name]:7.2f}s  {rate[name] / 1e6:6.2f} M rows/s  "
              f"{rate[name] / rate['parquet']:5.2f}x parquet   runs {[round(x, 2) for x in times[name]]}")
    ratio = rate["changes"] / rate["parquet"]
    ratio_ds = rate["changes_ds"] / rate["parquet"]
    snap = secs["snapshot"] / secs["parquet_groupby"]
    load_end = os.getloadavg()
    cpu = {name: statistics.median(v) for name, v in cpu_runs.items()}
    print("CPU seconds (process tree, median): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
    print(f"CPU ratios: parquet/changes {cpu['parquet'] / cpu['changes']:.2f} (throughput-like), "
          f"snapshot/native group-by {cpu['snapshot'] / cpu['parquet_groupby']:.2f}")
    print(f"read_changes / parquet = {ratio:.2f}x throughput (target >= {TARGET_CHANGES}x): "
          f"{'MET' if ratio >= TARGET_CHANGES else 'MISSED'}  (Python data source: {ratio_ds:.2f}x)")
    print(f"with a lease and planning per call: changes {rate['changes_leased'] / rate['parquet']:.2f}x, "
          f"snapshot {secs['snapshot_leased'] / secs['parquet_groupby']:.2f}x")
    print(f"read_snapshot / native group-by = {snap:.2f}x time (target <= {TARGET_SNAPSHOT}x): "
          f"{'MET' if snap <= TARGET_SNAPSHOT else 'MISSED'}")
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{load_end[0]:.1f} on {os.cpu_count()} CPUs")
    RESULTS.mkdir(exist_ok=True)
    out = {"name": "spark_read", "rows": rows, "parts": batches, "runs": runs, "statistic": "median",
           "seconds": secs, "runs_s": times, "rows_per_s": rate,
           "ratio": ratio, "ratio_data_source": ratio_ds, "snapshot_over_native_groupby": snap,
           "ratios": {"changes_over_parquet_throughput": ratio, "snapshot_over_native_groupby": snap,
                      "changes_leased_over_parquet_throughput": rate["changes_leased"] / rate["parquet"],
                      "snapshot_leased_over_native_groupby": secs["snapshot_leased"] / secs["parquet_groupby"]},
           "targets": {"changes_over_parquet_throughput": TARGET_CHANGES, "snapshot_over_native_groupby":
                       TARGET_SNAPSHOT},
           "loadavg_1m_start_end": [load_start[0], load_end[0]], "cpu_s": cpu,
           "cpu_ratios": {"changes_over_parquet_throughput": cpu["parquet"] / cpu["changes"],
                          "snapshot_over_native_groupby": cpu["snapshot"] / cpu["parquet_groupby"]},
           "python": sys.version.split()[0], "machine": platform.machine()}
    (RESULTS / result_name("spark_read", rows, 5_000_000)).write_text(json.dumps(out, indent=2) + "\n")


def result_name(name: str, size: int, default: int) -> str:
    """``name.json`` at the default size, ``name@<size>.json`` otherwise (both kept for the summary)."""
    return f"{name}.json" if size == default else f"{name}@{size}.json"


if __name__ == "__main__":
    main()
