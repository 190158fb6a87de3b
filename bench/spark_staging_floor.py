"""Where Spark staging's time goes: the floor any Python-side writer starts from.

In one SparkSession (local[2]) over one cached DataFrame (user string, action string,
amount int64, _time), each case is timed in rotating order (median of ``--reps``), wall
and CPU of the Spark process tree (JVM + Python workers):

- ``df.write.parquet`` (the baseline of bench/dag_overhead.py);
- ``mapInArrow`` with a Python function that only counts the rows: the JVM -> Arrow ->
  Python hand-off every Python-side writer pays before it does any work;
- ``sortWithinPartitions`` + ``df.write.parquet``: the least a JVM-only writer of sorted
  parts would cost (it would not consolidate yet);
- ``stage_dataframe``: shardsink's staging (consolidate, sort and write in Python);
- ``stage_dataframe(order="unordered")``: Spark's own writer with the checks observed in the
  same pass (:mod:`shardsink.spark.native_stage`), and ``observe + df.write.parquet``, its
  JVM-side work alone (the checks and the required ``_time``/``_diff`` projection), without
  the driver's footer reads and renames; ``+ a _diff = 1 column``: what storing the constant
  diffs costs Spark's writer (parts whose diffs are all 1 no longer store them);
- ``stage_dataframe(order="unordered", writer="python")``: the executors' pyarrow path.

Prints each case as a ratio to the baseline. Usage:
``python bench/spark_staging_floor.py [--rows 2000000] [--reps 5]``.
Results: bench/results/spark_staging_floor[@rows].json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import _path  # noqa: F401  (repo root on sys.path)

REPO = Path(__file__).resolve().parents[1]
START = 1_704_067_200_000
DAY = 86_400_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated case names to keep (besides the baseline)")
    args = ap.parse_args()
    load_start = os.getloadavg()

    import pyarrow as pa
    from dag_overhead import staging_frame  # the same rows as the staging target's benchmark
    from proc_cpu import spark_pid, tree_cpu

    from shardsink import Shard
    from shardsink.spark.stage import ARROW_BATCH_ROWS, stage_dataframe

    spark, df, schema = staging_frame(args.rows)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-floor-"))
    jvm = spark_pid(spark)

    def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([{"n": sum(b.num_rows for b in batches)}])

    def handoff(_: int) -> None:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS))  # as staging does
        try:
            df.mapInArrow(count_rows, "n long").collect()
        finally:
            spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    def stager(order: str, writer: str = "auto") -> Callable[[int], None]:
        def stage(i: int) -> None:
            url = (work / f"shard-{i}").as_uri()
            Shard.create(url, schema, upper=START)
            stage_dataframe(df, shard_url=url, schema=schema, lower=START, upper=START + DAY, desc_id=f"b{i}",
                            order=order, writer=writer)  # type: ignore[arg-type]
            shutil.rmtree(work / f"shard-{i}", ignore_errors=True)
        return stage

    def observed_write(i: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        t = F.col("_time")
        obs = Observation(f"floor-{i}")
        checks = [F.count(F.lit(1)), F.min(t), F.max(t), F.count_if(t.isNull()), F.lit(0), F.lit(0)]
        out = df.observe(obs, *checks).select(*[c for c in df.columns if c != "_time"],
                                              F.coalesce(t, F.lit(0)).alias("_time"), F.lit(1).alias("_diff"))
        out.write.mode("overwrite").parquet(str(work / "observed"))
        assert obs.get

    def projected_write(i: int) -> None:
        from pyspark.sql import functions as F

        t = F.col("_time")
        df.select(*[c for c in df.columns if c != "_time"], F.coalesce(t, F.lit(0)).alias("_time"),
                  F.lit(1).alias("_diff")).write.mode("overwrite").parquet(str(work / "projected"))

    def with_diff(i: int) -> None:
        from pyspark.sql import functions as F

        df.withColumn("_diff", F.lit(1).cast("long")).write.mode("overwrite").parquet(str(work / "with-diff"))

    cases: dict[str, Callable[[int], None]] = {
        "df.write.parquet": lambda i: df.write.mode("overwrite").parquet(str(work / "plain")),
        "df.write.parquet + a _diff = 1 column": with_diff,
        "hand-off to Python (no work)": handoff,
        "sortWithinPartitions + df.write.parquet": lambda i: df.sortWithinPartitions(*df.columns)
        .write.mode("overwrite").parquet(str(work / "sorted")),
        "stage_dataframe": stager("sorted"),
        "observe + df.write.parquet": observed_write,
        "projection + df.write.parquet": projected_write,
        "stage_dataframe(unordered)": stager("unordered"),
        "stage_dataframe(unordered; python)": stager("unordered", "python"),
    }
    if args.only:
        keep = {n.strip() for n in args.only.split(",")}
        cases = {k: v for i, (k, v) in enumerate(cases.items()) if i == 0 or k in keep}
    for fn in cases.values():
        fn(-1)  # warm-up
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for i in range(args.reps):
        for name in names[i % len(names):] + names[: i % len(names)]:
            c, t = tree_cpu(jvm), time.perf_counter()
            cases[name](i)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(tree_cpu(jvm) - c)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)

    base_w, base_c = statistics.median(wall[names[0]]), statistics.median(cpu[names[0]])
    print(f"{args.rows:,} rows, local[2], median of {args.reps}; ratio = case / {names[0]}")
    rows = {}
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        rows[name] = {"wall_s": round(w, 3), "cpu_s": round(c, 3), "wall_ratio": round(w / base_w, 2),
                      "cpu_ratio": round(c / base_c, 2)}
        print(f"  {name:42s} wall {w:6.2f} s ({w / base_w:4.2f}x)   CPU {c:6.2f} s ({c / base_c:4.2f}x)")
    load_end = os.getloadavg()
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{load_end[0]:.1f} on {os.cpu_count()} CPUs")
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    name = "spark_staging_floor.json" if args.rows == 2_000_000 else f"spark_staging_floor@{args.rows}.json"
    (out / name).write_text(json.dumps({"name": "spark_staging_floor", "rows": args.rows, "reps": args.reps,
                                        "cases": rows, "loadavg_1m_start_end": [load_start[0], load_end[0]]},
                                       indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
