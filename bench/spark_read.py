"""Read throughput: the ``shardsink`` Spark data source versus ``spark.read.parquet``.

One shard in a local folder holds N rows (id bigint, user string, country string,
amount double) in B batches of one part each. In one SparkSession (local[2]), each
reader scans every column of those same part files into the ``noop`` sink (all rows
materialised, nothing written), best of R timed runs after one warm-up. DataFrames are
created once (Parquet listing/footers and the shard's state are read at creation), and
both readers get two tasks (``minPartitions=2``; Spark splits the files itself):

* ``parquet``  - ``spark.read.parquet(<the part files>)`` (Spark's vectorised reader);
* ``changes``  - ``format("shardsink").option("mode", "changes")``: same columns and rows;
* ``updates``  - ``format("shardsink")`` snapshot updates (user columns + ``_diff``, time
  filtered on the executors), what ``read_snapshot`` aggregates;
* ``snapshot`` - ``read_snapshot`` (leased, ``groupBy`` over all columns: a shuffle);
  shown for scale, not part of the ratio.

Target: ``changes`` rows/s >= 0.7 x ``parquet`` rows/s.

    python bench/spark_read.py            # 5M rows, 8 batches, best of 3
    python bench/spark_read.py --quick    # 1M rows, 4 batches, best of 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import numpy as np
import pyarrow as pa

from shardsink import Shard
from shardsink.spark import datasource as ds
from shardsink.spark.read import read_snapshot
from shardsink_dev.testing import local_spark

RESULTS = Path(__file__).resolve().parent / "results"
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
        shard.append(t, lower=b * 1000, upper=(b + 1) * 1000, desc_id=f"b{b}")
    files = [f"{root}/events/{p.key}" for bt in shard.batches() for p in bt.parts]
    return shard, files


def best(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm-up: Python workers, JIT, page cache
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows, batches, runs = (1_000_000, 4, 2) if args.quick else (5_000_000, 8, 3)
    with tempfile.TemporaryDirectory(prefix="spark-read-") as tmp, local_spark("bench-spark-read") as spark:
        t0 = time.perf_counter()
        shard, files = build(Path(tmp), rows, batches)
        print(f"built {rows:,} rows in {batches} parts ({sum(Path(f).stat().st_size for f in files) / 2**20:.1f} MiB"
              f" Parquet) in {time.perf_counter() - t0:.1f}s")
        ds.register(spark)
        upper = batches * 1000

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        def snapshot() -> None:
            with read_snapshot(spark, shard.url) as df:
                noop(df)

        src = spark.read.format("shardsink").option("minPartitions", "2")
        parquet = spark.read.parquet(*files)  # listing and footers: planned once, like load() below
        changes = src.option("mode", "changes").option("from", "0").option("to", str(upper)).load(shard.url)
        updates = spark.read.format("shardsink").option("minPartitions", "2").load(shard.url)
        readers: dict[str, Callable[[], None]] = {
            "parquet": lambda: noop(parquet),
            "changes": lambda: noop(changes),
            "updates": lambda: noop(updates),
            "snapshot": snapshot,
        }
        secs = {name: best(fn, runs) for name, fn in readers.items()}
    rate = {name: rows / s for name, s in secs.items()}
    for name in readers:
        print(f"{name:9s} {secs[name]:7.2f}s  {rate[name] / 1e6:6.2f} M rows/s  "
              f"{rate[name] / rate['parquet']:5.2f}x parquet")
    ratio = rate["changes"] / rate["parquet"]
    print(f"data source / parquet = {ratio:.2f}x (target >= 0.7x): {'OK' if ratio >= 0.7 else 'BELOW TARGET'}")
    RESULTS.mkdir(exist_ok=True)
    out = {"rows": rows, "parts": batches, "runs": runs, "seconds": secs, "rows_per_s": rate, "ratio": ratio,
           "python": sys.version.split()[0], "machine": platform.machine()}
    (RESULTS / "spark_read.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
