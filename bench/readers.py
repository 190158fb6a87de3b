"""Engine readers: ``shardsink.read.duckdb`` / ``.polars`` snapshots versus the same engine on the same parts.

One shard in a local folder holds N rows (id bigint, user string, country string, amount
double) in B batches (``Shard.append``: each batch is cut into one part per core) plus one
batch retracting 1% of the rows. Each engine materialises the consolidated snapshot
(every result row, as an Arrow table / a Polars DataFrame) two ways:

* ``<engine>_direct``  - baseline: the engine reads exactly the same part files with
  ``read_parquet`` / ``scan_parquet`` and runs ``GROUP BY`` all columns with ``sum(_diff)``
  ``HAVING sum(_diff) <> 0`` (what a user would write by hand, without float
  normalisation, lease or state read);
* ``<engine>_shardsink`` - the leased reader, including its head read, lease write and
  re-read, planning, the normalisation of ``amount`` and the negative-count check, and
  the lease's release. Target: <= 1.1 x the baseline's time.

Every reader runs once to warm up, then R rounds in rotating order; medians are reported
(the machine is shared: ratios are taken within one run), with the CPU seconds of this
process (both engines run their threads in it: on a loaded machine the CPU ratio is the
steadier figure) and the load average.

    python bench/readers.py            # 5M rows, median of 3
    python bench/readers.py --quick    # 1M rows, median of 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _path  # noqa: F401  (repo root on sys.path)
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

import shardsink.read
from shardsink import Shard

TARGET = 1.1
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("country", pa.string()), ("amount", pa.float64())])
KEYS = SCHEMA.names


def build(root: Path, rows: int, batches: int) -> tuple[Shard, list[str]]:
    shard = Shard.create(f"file://{root}/events", SCHEMA)
    rng = np.random.default_rng(7)
    per = rows // batches
    countries = np.array(["de", "fr", "us", "jp", "br", "in", "ng", "au"])
    users = np.array([f"user-{i:06d}" for i in range(100_000)])
    kept = []
    for b in range(batches):
        ids = np.arange(b * per, (b + 1) * per, dtype=np.int64)
        t = pa.table({"id": ids, "user": pa.array(users[ids % 100_000]),
                      "country": pa.array(countries[rng.integers(0, len(countries), per)]),
                      "amount": rng.random(per) * 100, "_time": np.full(per, b * 1000 + 1, dtype=np.int64)})
        shard.append(t, lower=b * 1000, upper=(b + 1) * 1000, desc_id=f"b{b}")
        kept.append(t.slice(0, per // 100))
    gone = pa.concat_tables(kept)
    gone = gone.set_column(4, "_time", pa.array(np.full(gone.num_rows, batches * 1000, dtype=np.int64)))
    gone = gone.append_column("_diff", pa.array(np.full(gone.num_rows, -1, dtype=np.int64)))
    shard.append(gone, lower=batches * 1000, upper=batches * 1000 + 1000, desc_id="retract")
    files = [f"{root}/events/{p.key}" for bt in shard.batches() for p in bt.parts]
    return shard, files


def rounds(readers: dict[str, Callable[[], int]], runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each reader once to warm up (all must return the same row count), then ``runs`` rounds."""
    counts = {name: fn() for name, fn in readers.items()}
    assert len(set(counts.values())) == 1, f"readers disagree on the row count: {counts}"
    wall: dict[str, list[float]] = {k: [] for k in readers}
    cpu: dict[str, list[float]] = {k: [] for k in readers}
    names = list(readers)
    for i in range(runs):
        for name in names[i % len(names):] + names[: i % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            readers[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu


def readers_for(shard: Shard, files: list[str]) -> dict[str, Callable[[], int]]:
    con = duckdb.connect()
    cols = ", ".join(f'"{c}"' for c in KEYS)
    direct_sql = (f"SELECT {cols}, sum(_diff) AS _count FROM read_parquet({files!r}) "
                  f"GROUP BY {cols} HAVING sum(_diff) <> 0")

    def duckdb_direct() -> int:
        return con.sql(direct_sql).to_arrow_table().num_rows

    def duckdb_shardsink() -> int:
        with shardsink.read.duckdb(con, shard.url) as rel:
            return rel.to_arrow_table().num_rows

    def polars_direct() -> int:
        lf = pl.scan_parquet(files, glob=False, hive_partitioning=False)
        out = lf.group_by(KEYS).agg(pl.col("_diff").sum().alias("_count")).filter(pl.col("_count") != 0)
        return out.collect().height

    def polars_shardsink() -> int:
        with shardsink.read.polars(shard.url) as lf:
            return lf.collect().height

    return {"duckdb_direct": duckdb_direct, "duckdb_shardsink": duckdb_shardsink,
            "polars_direct": polars_direct, "polars_shardsink": polars_shardsink}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, help="rows in the shard (default 5,000,000)")
    ap.add_argument("--runs", type=int, help="timed rounds (default 3)")
    args = ap.parse_args()
    rows, batches, runs = (1_000_000, 2, 2) if args.quick else (5_000_000, 4, 3)
    rows, runs = args.rows or rows, args.runs or runs
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="readers-") as tmp:
        t0 = time.perf_counter()
        shard, files = build(Path(tmp), rows, batches)
        size = sum(Path(f).stat().st_size for f in files) / 2**20
        print(f"built {rows:,} rows + {rows // 100:,} retractions in {len(files)} parts ({size:.1f} MiB Parquet) "
              f"in {time.perf_counter() - t0:.1f}s; duckdb {duckdb.__version__}, polars {pl.__version__}, "
              f"{os.cpu_count()} cpus", flush=True)
        wall, cpu = rounds(readers_for(shard, files), runs)
    med = {k: statistics.median(v) for k, v in wall.items()}
    for name in wall:
        print(f"{name:18s} median {med[name]:6.3f}s  runs {' '.join(f'{x:.3f}' for x in wall[name])}  "
              f"cpu {statistics.median(cpu[name]):6.2f}s")
    verdicts = []
    for engine in ("duckdb", "polars"):
        ratio = med[f"{engine}_shardsink"] / med[f"{engine}_direct"]
        cpu_ratio = statistics.median(cpu[f"{engine}_shardsink"]) / statistics.median(cpu[f"{engine}_direct"])
        verdicts.append(ratio <= TARGET)
        print(f"{engine}: shardsink / direct = {ratio:.3f}x wall, {cpu_ratio:.3f}x cpu (target <= {TARGET}x wall): "
              f"{'OK' if ratio <= TARGET else 'MISSED'}")
    print(f"load average: start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not all(verdicts):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
