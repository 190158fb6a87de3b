"""What the persistence DAG costs on top of Spark (issue targets in brackets).

1. Staging throughput: ``stage_dataframe`` vs ``df.write.parquet`` of the same rows in the same
   SparkSession, per part order (``--orders``): sorted (mapInArrow + pyarrow parts written
   from the executors), unordered (Spark's own writer on this local folder) and
   unordered-python (the executors' path forced) [ratio <= 1.1 for the ingest default].
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
TARGET_STAGE = 1.1  # issue 20 §1, for the ingest default's part order


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


def staging_ratio(rows: int, work: Path, reps: int = 3,
                  orders: tuple[str, ...] = ("sorted", "unordered")) -> dict[str, object]:
    """``stage_dataframe`` of each part order in ``orders`` vs ``df.write.parquet``, interleaved.

    ``"unordered"`` on this local-folder shard takes Spark's own writer
    (:mod:`shardsink.spark.native_stage`); ``"unordered-python"`` forces the executors'
    pyarrow path (``writer="python"``) for comparison.
    """
    from proc_cpu import spark_pid, tree_cpu  # bench/ is on sys.path when run as a script

    from shardsink import Shard
    from shardsink.spark.stage import stage_dataframe

    spark, df, schema = staging_frame(rows)
    arm = {"sorted": "stage", "unordered": "stage_unordered", "unordered-python": "stage_unordered_python"}
    jvm = spark_pid(spark)

    def stager(order: str) -> Any:
        def stage(i: int) -> None:
            url = (work / f"shard-{order}-{i}").as_uri()
            Shard.create(url, schema, upper=START)
            parts = stage_dataframe(df, shard_url=url, schema=schema, lower=START, upper=START + DAY,
                                    desc_id=f"b{i}", order="sorted" if order == "sorted" else "unordered",
                                    writer="python" if order == "unordered-python" else "auto")
            assert sum(p.rows for p in parts) == rows
            shutil.rmtree(work / f"shard-{order}-{i}", ignore_errors=True)
        return stage

    def write(i: int) -> None:
        df.write.mode("overwrite").parquet(str(work / "plain"))

    cases = {"write_parquet": write, **{arm[o]: stager(o) for o in orders}}
    runs: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn(-1)  # warm-up: Python workers, JIT
    names = list(cases)
    for i in range(reps):  # the order rotated every round
        for name in names[i % len(names):] + names[: i % len(names)]:
            c, t = tree_cpu(jvm), time.perf_counter()
            cases[name](i)
            runs[name].append(time.perf_counter() - t)
            cpu[name].append(tree_cpu(jvm) - c)
    spark.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    out: dict[str, object] = {"rows": rows, "reps": reps, "statistic": "median", "target": TARGET_STAGE,
                              "write_parquet_s": round(med["write_parquet"], 2),
                              "runs_s": {k: [round(x, 2) for x in v] for k, v in runs.items()},
                              "cpu_s": {k: [round(x, 2) for x in v] for k, v in cpu.items()}}
    for name in names[1:]:
        out[name] = {"median_s": round(med[name], 2), "ratio": round(med[name] / med["write_parquet"], 2),
                     "best_ratio": round(min(runs[name]) / min(runs["write_parquet"]), 2),
                     "cpu_ratio": round(cmed[name] / max(1e-9, cmed["write_parquet"]), 2)}
    first = out[names[1]]  # bench/summary.py reads these keys: the first arm's of --orders
    assert isinstance(first, dict)
    out.update({"ratio_arm": names[1], "stage_s": first["median_s"], "ratio": first["ratio"],
                "best_ratio": first["best_ratio"], "cpu_ratio": first["cpu_ratio"]})
    return out


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
    ap.add_argument("--orders", default="sorted,unordered",
                    help="comma-separated arms of part 1: sorted, unordered, unordered-python")
    args = ap.parse_args()
    orders = tuple(o for o in args.orders.split(",") if o)
    if not orders or any(o not in ("sorted", "unordered", "unordered-python") for o in orders):
        raise SystemExit(f"--orders: expected sorted, unordered or unordered-python, got {args.orders!r}")
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-"))
    load_start = os.getloadavg()
    try:
        staging = staging_ratio(args.rows, work, args.reps, orders)
        results: dict[str, object] = {"name": "dag_overhead", "staging": staging}
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
    for name, a in s.items():
        if isinstance(a, dict) and "median_s" in a:
            print(f"staging {s['rows']} rows: {name} {a['median_s']}s vs df.write.parquet {s['write_parquet_s']}s "
                  f"-> ratio {a['ratio']} (median of {s['reps']}, best-of {a['best_ratio']}; target <= "
                  f"{TARGET_STAGE}); CPU of the Spark process tree: ratio {a['cpu_ratio']}")
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
