"""What the persistence DAG costs on top of Spark (issue targets in brackets).

1. Staging throughput: ``stage_dataframe`` (mapInArrow + pyarrow parts uploaded from the
   executors) vs ``df.write.parquet`` of the same rows in the same SparkSession [ratio <= 1.2].
2. One whole DAG run (``airflow dags test``, 1 writer) vs a bare ``spark-submit`` of the same
   write job: absolute overhead, and how much of it the mint and append tasks take
   [mint + append <= 3 s].
3. A no-op run (watermark not moved) finishes without starting a JVM (a fake
   ``spark-submit`` first on PATH records any call).

Usage: ``python bench/dag_overhead.py [--rows 2000000]``. Results: bench/results/dag_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
START = 1_704_067_200_000
DAY = 86_400_000
TARGET_STAGE = 1.2


def staging_frame(rows: int) -> tuple[Any, Any, Any]:
    """A local[2] SparkSession, the cached staging DataFrame of ``rows`` rows (user string,
    action string, amount int64, _time) and its shard schema; shared with
    bench/spark_staging_floor.py so both measure the same rows."""
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    # Python workers must run this interpreter (it has pyarrow), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.range(rows, numPartitions=max(4, rows // 500_000))
          .select(F.concat(F.lit("user-"), (F.col("id") % 100000).cast("string")).alias("user"),
                  (F.col("id") % 7).cast("string").alias("action"), (F.col("id") * 3).alias("amount"),
                  (F.lit(START) + F.col("id") % DAY).alias("_time"))).cache()
    df.count()
    return spark, df, pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])


def staging_ratio(rows: int, work: Path, reps: int = 3) -> dict[str, object]:
    from proc_cpu import spark_pid, tree_cpu  # bench/ is on sys.path when run as a script

    from shardsink import Shard
    from shardsink.spark.stage import stage_dataframe

    spark, df, schema = staging_frame(rows)
    runs: dict[str, list[float]] = {"stage": [], "write_parquet": []}
    cpu: dict[str, list[float]] = {"stage": [], "write_parquet": []}
    jvm = spark_pid(spark)

    def stage(i: int) -> None:
        url = (work / f"shard-{i}").as_uri()
        Shard.create(url, schema, upper=START)
        parts = stage_dataframe(df, shard_url=url, schema=schema, lower=START, upper=START + DAY, desc_id=f"b{i}")
        assert sum(p.rows for p in parts) == rows

    def write(i: int) -> None:
        df.write.mode("overwrite").parquet(str(work / f"plain-{i}"))

    stage(-1)  # warm-up: Python workers, JIT
    write(-1)
    for i in range(reps):  # alternating, the order swapped every round
        order = [("stage", stage), ("write_parquet", write)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            c, t = tree_cpu(jvm), time.perf_counter()
            fn(i)
            runs[name].append(time.perf_counter() - t)
            cpu[name].append(tree_cpu(jvm) - c)
            shutil.rmtree(work / f"shard-{i}", ignore_errors=True)
    spark.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"rows": rows, "reps": reps, "statistic": "median", "stage_s": round(med["stage"], 2),
            "write_parquet_s": round(med["write_parquet"], 2), "ratio": round(med["stage"] / med["write_parquet"], 2),
            "best_ratio": round(min(runs["stage"]) / min(runs["write_parquet"]), 2),
            "runs_s": {k: [round(x, 2) for x in v] for k, v in runs.items()}, "target": TARGET_STAGE,
            "cpu_s": {k: [round(x, 2) for x in v] for k, v in cpu.items()},
            "cpu_ratio": round(statistics.median(cpu["stage"]) / max(1e-9, statistics.median(cpu["write_parquet"])), 2)}


def _env(work: Path) -> dict[str, str]:
    home = work / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO", "PYTHONWARNINGS": "ignore",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type":"spark","host":"local[2]"}',
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SHARDSINK_LANDING": str(work / "landing"), "SHARDSINK_SHARD": (work / "shard").as_uri(),
        "SHARDSINK_WRITERS": "1",
    })
    return env


_TASK = re.compile(r"^(\S+) .*\[DAG TEST\] (starting|end task) task_id=(\S+) map_index")


def _task_seconds(log: str) -> dict[str, float]:
    started: dict[str, datetime] = {}
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = _TASK.match(line)
        if not m:
            continue
        ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        key = m.group(3)
        if m.group(2) == "starting":
            started[key] = ts
        elif key in started:
            out[key] = out.get(key, 0.0) + (ts - started.pop(key)).total_seconds()
    return out


def dag_vs_bare(work: Path) -> dict[str, object]:
    from shardsink.sinks.description import Description
    from shardsink.sinks.ingest import mint_chain, open_or_create
    from shardsink.sources import source_spec
    from shardsink.sources.landing import LandingSource
    from shardsink.spark import build_pyfiles_zip, job_path
    from shardsink.spark.request import IngestWriteRequest, job_argv
    from shardsink_dev.synthetic import generate

    env = _env(work)
    generate(env["SHARDSINK_LANDING"], start=START, days=2, files_per_day=3, rows_per_file=2000)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)

    # bare spark-submit of the same job (day 2 on a scratch shard, so both write the same amount)
    src = LandingSource(env["SHARDSINK_LANDING"])
    scratch = open_or_create((work / "scratch").as_uri(), src, initial_upper=START)
    # What the mint task itself does (open the shard, read the watermark, mint), apart from
    # the task runner: under `dags test` the first task also pays for starting Airflow's
    # in-process execution API, which a deployed scheduler/worker does not.
    t = time.perf_counter()
    chain = mint_chain(open_or_create(scratch.url, src, initial_upper=START), src, interval_end=START + DAY,
                       max_span=None, max_chain=1, dag_id="bench", run_id="bare", attempt=1)
    mint_work = time.perf_counter() - t
    assert isinstance(chain, list)
    d = chain[0]
    assert isinstance(d, Description)
    cmd = [str(BIN / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf",
           "spark.sql.shuffle.partitions=2", "--py-files", build_pyfiles_zip(), job_path(),
           *job_argv(IngestWriteRequest(shard_url=scratch.url, source=source_spec(src), desc=d, slot=0, slots=1))]
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    bare = time.perf_counter() - t

    t = time.perf_counter()
    r = subprocess.run([str(BIN / "airflow"), "dags", "test", "example_ingest", "2024-01-02"], env=env,
                       capture_output=True, text=True)
    whole = time.perf_counter() - t
    assert r.returncode == 0, r.stdout[-3000:]
    tasks = _task_seconds(r.stdout + r.stderr)
    mint_s, append_s = tasks.get("attempt_1.mint", -1.0), tasks.get("attempt_1.append", -1.0)
    return {"bare_spark_submit_s": round(bare, 2), "dag_run_s": round(whole, 2),
            "overhead_s": round(whole - bare, 2), "mint_task_s": round(mint_s, 2),
            "append_task_s": round(append_s, 2), "write_task_s": round(tasks.get("attempt_1.write", -1.0), 2),
            "mint_plus_append_s": round(mint_s + append_s, 2), "mint_work_s": round(mint_work, 3)}


def noop_run(work: Path) -> dict[str, object]:
    env = _env(work)  # same shard: day 1 is done, so re-running its interval is a no-op
    fake = work / "fakebin"
    fake.mkdir(exist_ok=True)
    marker = work / "spark-submit-called"
    (fake / "spark-submit").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (fake / "spark-submit").chmod(0o755)
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    t = time.perf_counter()
    r = subprocess.run([str(BIN / "airflow"), "dags", "test", "example_ingest", "2024-01-02"], env=env,
                       capture_output=True, text=True)
    whole = time.perf_counter() - t
    assert r.returncode == 0, r.stdout[-3000:]
    reason = next((ln.split("] ", 1)[-1][:160] for ln in r.stdout.splitlines() if "nothing to do" in ln), "")
    return {"noop_run_s": round(whole, 2), "jvm_started": marker.exists(), "reason": reason}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=3, help="alternating staging/write rounds (median)")
    ap.add_argument("--staging-only", action="store_true", help="only part 1 (e.g. at 10x the rows)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-"))
    load_start = os.getloadavg()
    try:
        results: dict[str, object] = {"name": "dag_overhead", "staging": staging_ratio(args.rows, work, args.reps)}
        if not args.staging_only:
            results.update({"dag": dag_vs_bare(work), "noop": noop_run(work)})
        results["load_avg"] = os.getloadavg()
        results["loadavg_1m_start_end"] = [load_start[0], os.getloadavg()[0]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "dag_overhead.json" if args.rows == 2_000_000 and not args.staging_only else f"dag_overhead@{args.rows}.json"
    (out / name).write_text(json.dumps(results, indent=2))
    s = results["staging"]
    assert isinstance(s, dict)
    print(f"staging {s['rows']} rows: stage_dataframe {s['stage_s']}s vs df.write.parquet {s['write_parquet_s']}s "
          f"-> ratio {s['ratio']} (median of {s['reps']}, best-of {s['best_ratio']}; target <= {TARGET_STAGE}); "
          f"CPU of the Spark process tree: ratio {s['cpu_ratio']} {s['cpu_s']}")
    if not args.staging_only:
        d, n = results["dag"], results["noop"]
        assert isinstance(d, dict) and isinstance(n, dict)
        print(f"DAG run {d['dag_run_s']}s vs bare spark-submit {d['bare_spark_submit_s']}s -> overhead "
              f"{d['overhead_s']}s; mint {d['mint_task_s']}s + append {d['append_task_s']}s = "
              f"{d['mint_plus_append_s']}s (target <= 3s); mint's own work {d['mint_work_s']}s (the rest of the "
              "mint task is `dags test` starting its API)")
        print(f"no-op run {n['noop_run_s']}s, JVM started: {n['jvm_started']} ({n['reason']})")
    print(f"load average (1 min) at start/end: {results['loadavg_1m_start_end']} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
