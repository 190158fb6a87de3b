"""Cost of reading an evolved shard in Spark (issue 19): an evolved shard's reads versus the
same rows in a shard that never evolved, natively planned and through the Python data source.

Two shards in a local folder hold the same N rows in B batches (one sorted part each):

* ``evolved`` - written under ten schema ids, B/10 batches each, the nine changes mixing
  every kind (:data:`CHANGES`): add ``note``, rename ``country -> region``, widen ``id``
  int32 -> int64, drop ``tag``, widen ``amount`` float32 -> float64, rename ``user ->
  user_name``, add ``score``, widen ``qty`` int16 -> int32, rename ``note -> comment``;
* ``flat``    - the same rows projected onto the final schema, all written under it.

The drop makes the parts written before it *lossy* under the current schema (they hold a
column the reader does not see): the native change feed must consolidate them (two rows
that differed only in ``tag`` become one), a hash aggregation a feed of ``flat`` never
needs, until compaction rewrites them. So the feed is measured three ways: ``changes``
(the drop 4th: the first 40% of rows lossy), ``changes_early_drop`` (the same ten schema
ids, the drop first: 10% lossy) and ``changes_unconsolidated`` (``consolidate=False``:
the scan and projection alone).

In one SparkSession (local[2]) each reader writes its DataFrame to the ``noop`` sink; every
reader runs once to warm up, then R rounds in rotating order; medians reported with CPU
seconds of the process tree (the machine is shared: ratios are taken within one run):

* ``*_flat``   - reads of ``flat``: the baselines (native; ``*_ds_flat``: the data source);
* ``changes*`` / ``snapshot`` - native reads of the evolved shards (parts of schema ids whose
  physical columns agree share one scan: here all ten, ``native_read.scan_groups``);
* ``*_ds``     - the data source over the evolved shard, against ``*_ds_flat``;
* ``pyarrow_snapshot`` - ``Shard.snapshot()`` of the evolved shard (every part projected by
  field id in Arrow), against ``pyarrow_flat``, the same of ``flat``.

    python bench/spark_evolved_read.py            # 2M rows, 10 batches, median of 3
    python bench/spark_evolved_read.py --quick    # 400k rows, median of 3
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import numpy as np
import pyarrow as pa
from proc_cpu import rounds  # bench/ is on sys.path when run as a script

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.spark import native_read as nr
from shardsink.spark.read import ShardReads
from shardsink_dev.testing import local_spark

RESULTS = Path(__file__).resolve().parent / "results"
START = pa.schema([("id", pa.int32()), ("user", pa.string()), ("country", pa.string()), ("amount", pa.float32()),
                   ("qty", pa.int16()), ("tag", pa.string())])
CHANGES = [SchemaChange(kind="add", name="note", type="string"),
           SchemaChange(kind="rename", name="country", new_name="region"),
           SchemaChange(kind="widen", name="id", type="int64"),
           SchemaChange(kind="drop", name="tag"),
           SchemaChange(kind="widen", name="amount", type="float64"),
           SchemaChange(kind="rename", name="user", new_name="user_name"),
           SchemaChange(kind="add", name="score", type="int32"),
           SchemaChange(kind="widen", name="qty", type="int32"),
           SchemaChange(kind="rename", name="note", new_name="comment")]
#: The same ten schema ids with the drop first: only the first schema id's parts are lossy.
EARLY_DROP = [CHANGES[3], *CHANGES[:3], *CHANGES[4:]]
FINAL = pa.schema([("id", pa.int64()), ("user_name", pa.string()), ("region", pa.string()), ("amount", pa.float64()),
                   ("qty", pa.int32()), ("comment", pa.string()), ("score", pa.int32())])
VERSIONS = len(CHANGES) + 1


def _batch(b: int, per: int, rng: np.random.Generator) -> dict[str, Any]:
    """Batch ``b``'s values by the columns' first names (``_time``: one time per batch)."""
    ids = np.arange(b * per, (b + 1) * per, dtype=np.int64)
    countries = np.array(["de", "fr", "us", "jp", "br", "in", "ng", "au"])
    return {"id": ids, "user": pa.array([f"user-{i % 100_000:06d}" for i in ids]),
            "country": pa.array(countries[rng.integers(0, len(countries), per)]),
            "amount": (rng.random(per) * 100).astype(np.float32), "qty": (ids % 1000).astype(np.int16),
            "tag": pa.array([f"t{i % 3}" for i in ids]), "note": pa.array([f"n{i % 7}" for i in ids]),
            "score": (ids % 100).astype(np.int32), "_time": np.full(per, b * 1000 + 1, dtype=np.int64),
            "_diff": np.ones(per, dtype=np.int64)}


def _first_names(changes: list[SchemaChange], applied: int) -> dict[str, str]:
    """Current column name -> its first name, after the first ``applied`` changes."""
    first = {n: n for n in START.names}
    for c in changes[:applied]:
        if c.kind == "add":
            first[c.name] = c.name
        elif c.kind == "drop":
            first.pop(c.name)
        elif c.kind == "rename" and c.new_name is not None:
            first[c.new_name] = first.pop(c.name)
    return first


def build(root: Path, rows: int, batches: int) -> dict[str, Shard]:
    """The evolved shards and their flat twin (module docstring)."""
    shards = {"evolved": Shard.create(f"file://{root}/evolved", START),
              "early_drop": Shard.create(f"file://{root}/early_drop", START),
              "flat": Shard.create(f"file://{root}/flat", FINAL)}
    changes = {"evolved": CHANGES, "early_drop": EARLY_DROP}
    final_first = _first_names(CHANGES, len(CHANGES))
    rng = np.random.default_rng(7)
    per, step = rows // batches, max(1, batches // VERSIONS)
    for b in range(batches):
        applied = min(b // step, len(CHANGES))
        cols = _batch(b, per, rng)
        bounds = {"lower": b * 1000, "upper": (b + 1) * 1000, "desc_id": f"b{b}"}
        for name, s in shards.items():
            if name == "flat":
                have = _first_names(CHANGES, applied).values()
                t = {f.name: pa.array(cols[final_first[f.name]]).cast(f.type) if final_first[f.name] in have
                     else pa.nulls(per, f.type) for f in FINAL}
            else:
                first = _first_names(changes[name], applied)
                t = {f.name: pa.array(cols[first[f.name]]).cast(f.type) for f in s.schema}
            s.append(pa.table(t | {"_time": cols["_time"], "_diff": cols["_diff"]}), **bounds)  # type: ignore[arg-type]
        if b + 1 < batches and (b + 1) % step == 0 and (b + 1) // step <= len(CHANGES):
            for name in changes:
                shards[name].evolve(changes[name][(b + 1) // step - 1])
    return shards


def readers(spark: Any, shards: dict[str, Shard], upper: int) -> tuple[dict[str, Any], Any]:
    """The DataFrames each reader writes (module docstring), in rotation order; and the reads to close."""
    fast = ShardReads(spark, holder="bench", native="always").__enter__()
    slow = ShardReads(spark, holder="bench-ds", native="never").__enter__()
    ev, early, flat = shards["evolved"].url, shards["early_drop"].url, shards["flat"].url
    frames = {"changes_flat": fast.changes(flat, 0, upper), "changes": fast.changes(ev, 0, upper),
              "changes_early_drop": fast.changes(early, 0, upper),
              "changes_unconsolidated": fast.changes(ev, 0, upper, consolidate=False),
              "snapshot_flat": fast.snapshot(flat), "snapshot": fast.snapshot(ev),
              "changes_ds_flat": slow.changes(flat, 0, upper), "changes_ds": slow.changes(ev, 0, upper),
              "snapshot_ds_flat": slow.snapshot(flat), "snapshot_ds": slow.snapshot(ev)}
    return frames, (fast, slow)


def scans(s: Shard) -> list[list[int]]:
    """The schema ids each native scan of a current-schema read of ``s`` covers."""
    plan = s.reader().plan()
    return [g.ids for g in nr.scan_groups(plan, plan.parts)]


def baseline(name: str) -> str:
    """The flat reader ``name`` is compared with."""
    kind = name.split("_")[0]
    return f"{kind}_ds_flat" if "_ds" in name else f"{kind}_flat"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, help="rows in each shard (default 2,000,000)")
    ap.add_argument("--runs", type=int, help="timed rounds (default 3)")
    ap.add_argument("--batches", type=int, default=VERSIONS, help=f"batches, a multiple of {VERSIONS}")
    args = ap.parse_args()
    if args.batches < VERSIONS or args.batches % VERSIONS:
        ap.error(f"--batches {args.batches} is not a positive multiple of {VERSIONS}")
    rows, runs = (400_000, 3) if args.quick else (2_000_000, 3)
    rows, runs, batches = args.rows or rows, args.runs or runs, args.batches
    if rows < batches or runs < 1:
        ap.error(f"--rows {rows} must be at least --batches {batches}, --runs {runs} at least 1")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spark-evolved-") as tmp, local_spark("bench-evolved") as spark:
        t0 = time.perf_counter()
        shards = build(Path(tmp), rows, batches)
        ids = sorted({b.schema_id for b in shards["evolved"].batches()})
        print(f"built 3 x {rows:,} rows in {batches} batches (evolved: schema ids {ids}, native scans "
              f"{scans(shards['evolved'])}) in {time.perf_counter() - t0:.1f}s", flush=True)

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        frames, reads = readers(spark, shards, batches * 1000)
        try:
            assert all(frames[k].count() == rows for k in frames if k.startswith("snapshot"))
            calls: dict[str, Callable[[], Any]] = {k: functools.partial(noop, df) for k, df in frames.items()}
            calls |= {"pyarrow_flat": shards["flat"].snapshot, "pyarrow_snapshot": shards["evolved"].snapshot}
            times, cpu_runs = rounds(calls, runs)
        finally:
            for r in reads:
                r.__exit__(None, None, None)
    load_end = os.getloadavg()
    secs = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_runs.items()}
    ratios = {f"{k}_over_{baseline(k)}": {"wall": secs[k] / secs[baseline(k)], "cpu": cpu[k] / cpu[baseline(k)]}
              for k in calls if k != baseline(k)}
    for k in calls:
        b = baseline(k)
        print(f"{k:22s} {secs[k]:6.2f}s  cpu {cpu[k]:6.1f}s  {secs[k] / secs[b]:5.2f}x wall, "
              f"{cpu[k] / cpu[b]:5.2f}x cpu vs {b:16s} runs {[round(x, 2) for x in times[k]]}")
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{load_end[0]:.1f} on {os.cpu_count()} CPUs")
    RESULTS.mkdir(exist_ok=True)
    out = {"name": "spark_evolved_read", "rows": rows, "batches": batches, "schema_ids": ids, "runs": runs,
           "statistic": "median", "seconds": secs, "cpu_s": cpu, "runs_s": times, "ratios": ratios,
           "loadavg_1m_start_end": [load_start[0], load_end[0]], "python": sys.version.split()[0],
           "machine": platform.machine()}
    name = "spark_evolved_read.json" if rows == 2_000_000 else f"spark_evolved_read@{rows}.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
