"""A landing run costs its own day, not the zone's history: one day's ingest with H days of history
vs with 3 days (the named baseline), in one run, on S3 (moto over real HTTP through a counting proxy).

For each history H (3 = baseline, 90, and 365 with ``--year``): land H days of ``--files`` Parquet
files x ``--rows`` rows, create the shard at the start of day H-1, ingest day H-1 (cold: the mint
indexes the whole zone, footers only), then land day H and ingest it, and the same for the next
days (``MEASURED_DAYS`` in all; each figure the best of them): mint -> every slot's write job
from the mint's plan -> append, the library calls the Airflow tasks and the spark-submit job
make. Measured: wall, GETs and bytes of landed files (a ranged GET counts its range; a whole
GET the object's size), LIST requests on the zone, CPU seconds of the process tree (this
process, the Spark JVM and its Python workers; the moto server left out: the machine is shared,
so CPU is the steadier figure), the ``add_columns`` mint: the mint plus its check
(:func:`evolve_for_source` with the chain the mint just prepared), and the bytes the run wrote
to the landed-file index (a delta of its new entries) next to the whole index's size, the
bytes its mint read of the index, and its plan's size and late-check list (the older files not
judged on time yet: issue 41 keeps it flat). Two arms, each against its own
3-day baseline: a flat zone (``dt=NNNN/`` folders, no declared layout: one LIST of the zone per
run) and a declared ``partitions="dt=YYYY-MM-DD"`` layout (lateness 1d: the run lists 2 day
folders). Then peak RSS of a Python process streaming a large Parquet file
(:func:`shardsink.sources.landing.read.stream_rows`, what a write job's worker does).

Targets (issue 33): H / 3 days wall <= 1.1x, bytes <= 1.1x the day's own bytes + footers, GETs
<= the day's files + footers, add_columns mint <= 1.1x; peak RSS <= 512 MiB for a 2 GB file.
Appends to bench/RESULTS.md and prints a FIGURE line.

    python bench/landing_history.py [--year] [--big-mb 2048] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "plugins")]
RESULTS = Path(__file__).resolve().parent / "results"
DAY = 86_400_000
PARTITIONED = "dt=YYYY-MM-DD"  # the declared-layout arm (lateness 1d)


def land(root: str, days: int, files: int, rows: int, layout: str | None = None, *, first: int = 0
         ) -> dict[str, int]:
    """Days ``first`` to ``days - 1`` of ``files`` files; in folders ``dt=NNNN/`` (flat: no date, not
    a declared layout) or, with ``layout``, the declared day folders (``dt=1970-01-01/`` ...);
    the watermark published at the end of the last one. Returns every landed object's size."""
    import pyarrow as pa

    from shardsink_dev.synthetic import land_file, publish_watermark

    sizes = {}
    for d in range(first, days):
        for i in range(files):
            t = pa.table({"id": pa.array(range(rows), pa.int64()), "v": [f"v{j % 97}" for j in range(rows)],
                          "event_time": pa.array([d * DAY + j * (DAY // rows) for j in range(rows)], pa.int64())})
            key = f"{day_folder(d, layout)}f{i}.parquet"
            land_file(root, key, t)
    from shardsink.storage.url import open_blob

    for o in open_blob(root).list(""):
        sizes[o.key] = o.size
    publish_watermark(root, days * DAY)
    return sizes


def day_folder(day: int, layout: str | None) -> str:
    import datetime as dt

    from shardsink.sources.landing.partitions import folder

    return folder(layout, dt.date(1970, 1, 1) + dt.timedelta(days=day)) if layout else f"dt={day:04d}/"


def one_day(spark: Any, shard_url: str, src: Any, day: int, slots: int = 2) -> tuple[float, str]:
    """Mint, every slot's write job, append; returns (the mint's seconds, the description's id)."""
    from shardsink.sinks.append import append_from_manifests
    from shardsink.sinks.ingest import mint_chain, open_or_create
    from shardsink.sinks.seals import seals
    from shardsink.sinks.staging import write_manifest
    from shardsink.spark.stage import stage_dataframe

    shard = open_or_create(shard_url, src, initial_upper=day * DAY)
    t0 = time.perf_counter()
    out = mint_chain(shard, src, interval_end=(day + 1) * DAY, max_span=None, max_chain=1, dag_id="b",
                     run_id=f"r{day}", attempt=1)
    assert isinstance(out, list), out
    mint_s = time.perf_counter() - t0
    d = out[0]
    head = shard.reader().head()
    for slot in range(slots):
        df, got = src.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots, schema=head.header.schema,
                                seals=seals(shard, head=head), shard_url=shard_url, desc_id=d.desc_id)
        parts = stage_dataframe(df, shard_url=shard_url, schema=head.header.schema, lower=d.lower, upper=d.upper,
                                desc_id=d.desc_id)
        write_manifest(shard, d, slot=slot, slots=slots, parts=parts, inputs=got)
    append_from_manifests(shard, d, slots)
    return mint_s, d.desc_id


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process and its live children (the Spark JVM and its
    Python workers), the moto server left out: what the measured run itself burns."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            if any("moto" in part for part in p.cmdline()):
                continue
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def landed_reads(proxy: Any, landing_prefix: str, sizes: dict[str, int]) -> tuple[int, int]:
    gets, nbytes = 0, 0
    for q in proxy.requests():
        if q.method != "GET" or landing_prefix not in q.key or q.key.endswith("_watermark.json"):
            continue
        gets += 1
        m = re.match(r"bytes=(\d+)-(\d+)", q.headers.get("range", ""))
        key = q.key.split(landing_prefix + "/", 1)[-1]
        nbytes += int(m.group(2)) - int(m.group(1)) + 1 if m else sizes.get(key, 0)
    return gets, nbytes


#: Days measured after the cold one, each a full run; every figure is the best of them.
MEASURED_DAYS = 5


def history_run(spark: Any, proxy: Any, days: int, files: int, rows: int, layout: str | None = None
                ) -> dict[str, Any]:
    import msgspec
    import pyarrow as pa

    from shardsink import Shard
    from shardsink.core.roots import RootObjects
    from shardsink.sinks.evolve import evolve_for_source
    from shardsink.sources.landing import LandingSource
    from shardsink.sources.landing.index import FilePlan, plan_key
    from shardsink.sources.landing.layout import INDEX_KEY

    pre = f"s3://bench/h{days}-{uuid.uuid4().hex[:6]}"
    root, shard_url = f"{pre}/landing", f"{pre}/shard"
    land(root, days, files, rows, layout)
    src = LandingSource(root, schema=pa.schema([("id", pa.int64()), ("v", pa.string())]), partitions=layout,
                        lateness="1d" if layout else None)
    t0 = time.perf_counter()
    _, desc_id = one_day(spark, shard_url, src, days - 1)  # cold: indexes the zone
    cold = time.perf_counter() - t0
    evolve_for_source(Shard.open(shard_url), src, writer="bench", desc_id=desc_id)
    # MEASURED_DAYS days, each landing just before its run (as a producer does): the fastest counts
    # (the mint is ~0.1 s: one sample's noise is a tenth of it).
    samples = []
    for day in range(days, days + MEASURED_DAYS):
        sizes = land(root, day + 1, files, rows, layout, first=day)
        proxy.wait_idle()
        proxy.clear()
        t0, c0 = time.perf_counter(), tree_cpu()
        mint_s, desc_id = one_day(spark, shard_url, src, day)
        wall, cpu = time.perf_counter() - t0, tree_cpu() - c0
        t0 = time.perf_counter()
        evolve_for_source(Shard.open(shard_url), src, writer="bench", desc_id=desc_id)  # the add_columns step
        check_s = time.perf_counter() - t0
        proxy.wait_idle()
        samples.append((wall, cpu, mint_s, check_s))
    wall, cpu, mint_s, check_s = (min(x) for x in zip(*samples, strict=True))
    gets, nbytes = landed_reads(proxy, "landing", sizes)
    lists = sum(1 for q in proxy.requests() if q.method == "GET" and "list-type" in q.query and "landing" in q.query)
    # The proxy does not log body sizes: read back what the last day's PUTs left (its own objects).
    store = RootObjects(shard_url)
    index_puts = [len(store.get(q.key.split("/shard/", 1)[1]) or b"") for q in proxy.requests()
                  if q.method == "PUT" and "/shard/landing/index" in q.key]
    base = store.get(INDEX_KEY) or b""
    # What the last day's mint read of the index (its GETs, sized by what they fetched: the objects
    # as they are now, written before that GET or by that run), and its plan: the late check's work
    # is the plan's ``older`` list (files not judged on time yet), which must not grow with history.
    index_gets = [q.key.split("/shard/", 1)[1] for q in proxy.requests()
                  if q.method == "GET" and "/shard/landing/index" in q.key]
    plan = store.get(plan_key(desc_id)) or b""
    older = len(msgspec.json.decode(plan, type=FilePlan).older) if plan else -1
    day_bytes = sum(v for k, v in sizes.items() if k.startswith(day_folder(days + MEASURED_DAYS - 1, layout)))
    return {"history_days": days, "layout": layout or "flat", "files": (days + MEASURED_DAYS) * files,
            "cold_seconds": round(cold, 3), "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "landing_lists": lists, "landed_gets": gets,
            "landed_bytes": nbytes, "day_bytes": day_bytes, "day_files": files, "mint_seconds": round(mint_s, 3),
            "add_columns_check_seconds": round(check_s, 3), "add_columns_mint_seconds": round(mint_s + check_s, 3),
            "index_puts": len(index_puts), "index_put_bytes": sum(index_puts), "index_base_bytes": len(base),
            "index_gets": len(index_gets), "index_read_bytes": sum(len(store.get(k) or b"") for k in index_gets),
            "plan_bytes": len(plan), "plan_older_files": older}


RSS_CHILD = """
import resource, sys
sys.path[:0] = [{plugins!r}]
from shardsink.sources.landing import LandingSource
from shardsink.sources.landing.read import stream_rows
import pyarrow as pa
src = LandingSource({root!r})
f = src.files()[0]
rows = 0
for t in stream_rows(src.blob(), f, pa.schema([("id", pa.int64()), ("v", pa.string())]), "event_time",
                     root=src.root, window=(0, 2**62)):
    rows += t.num_rows
print(rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss(big_mb: int, tmp: Path) -> dict[str, Any]:
    """Write a Parquet file of about ``big_mb`` MiB (row groups of 1M rows) and stream it in a child."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "big" / "big.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("v", pa.string()), ("event_time", pa.int64())]),
                          compression="none") as w:
        n = 0
        while path.stat().st_size < big_mb * 2**20 if path.exists() else True:
            ids = rng.integers(0, 2**62, 1_000_000)
            w.write_table(pa.table({"id": ids, "v": pa.array(ids.astype(str)), "event_time": np.arange(
                n, n + 1_000_000, dtype=np.int64)}), row_group_size=1_000_000)
            n += 1_000_000
    size = path.stat().st_size
    out = subprocess.run([sys.executable, "-c", RSS_CHILD.format(plugins=str(REPO / "plugins"), root=str(path.parent))],
                         capture_output=True, text=True, check=True)
    rows, kib = out.stdout.split()
    path.unlink()
    return {"file_bytes": size, "rows": int(rows), "peak_rss_mib": round(int(kib) / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--year", action="store_true", help="also 365 days of history")
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--big-mb", type=int, default=2048)
    ap.add_argument("--tmp", default="/tmp")
    a = ap.parse_args()
    rows = a.rows or (2_000 if a.quick else 50_000)
    histories = [3, 30] if a.quick else [3, 90, *([365] if a.year else [])]

    from support.faultproxy import fault_proxy

    from shardsink_dev.testing import local_spark, moto_server

    with moto_server() as moto:
        moto.make_bucket("bench")
        os.environ.update(moto.env())
        with fault_proxy(moto.endpoint) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.url
            with local_spark("bench-landing-history") as spark:
                runs = [history_run(spark, proxy, h, a.files, rows, layout) for layout in (None, PARTITIONED)
                        for h in histories]
                for r in runs:
                    print(json.dumps(r), flush=True)
    rss = peak_rss(64 if a.quick else a.big_mb, Path(a.tmp))
    report(runs, rss, rows=rows, files=a.files)


def report(runs: list[dict[str, Any]], rss: dict[str, Any], *, rows: int, files: int) -> None:
    load = os.getloadavg()
    lines: list[str] = []
    top: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for r in runs:
        base = next(b for b in runs if b["layout"] == r["layout"])  # the arm's 3-day baseline
        if r is base:
            continue
        wall, cpu = r["seconds"] / base["seconds"], r["cpu_seconds"] / base["cpu_seconds"]
        mint = r["add_columns_mint_seconds"] / base["add_columns_mint_seconds"]
        lines.append(
            f"| {r['layout']}: {r['history_days']} d / 3 d history ({files} files x {rows} rows a day) | wall "
            f"{wall:.2f}x ({r['seconds']:.2f} s vs {base['seconds']:.2f} s) | CPU {cpu:.2f}x ({r['cpu_seconds']:.2f} s "
            f"vs {base['cpu_seconds']:.2f} s) | LISTs {r['landing_lists']} (3 d: {base['landing_lists']}) | bytes read "
            f"{r['landed_bytes']} = {r['landed_bytes'] / r['day_bytes']:.3f}x the day's {r['day_bytes']} (footers "
            f"included) | GETs {r['landed_gets']} (3 d: {base['landed_gets']}; day's files {r['day_files']}) | "
            f"add_columns mint {mint:.2f}x ({r['add_columns_mint_seconds']:.2f} s vs "
            f"{base['add_columns_mint_seconds']:.2f} s; check alone {r['add_columns_check_seconds']:.2f} s vs "
            f"{base['add_columns_check_seconds']:.2f} s) | index written {r['index_put_bytes']} B in "
            f"{r['index_puts']} PUT (the whole index: {r['index_base_bytes']} B) | index read "
            f"{r['index_read_bytes']} B in {r['index_gets']} GETs (3 d: {base['index_read_bytes']} B) | the day's plan "
            f"{r['plan_bytes']} B, late check of {r['plan_older_files']} older files (3 d: {base['plan_bytes']} B, "
            f"{base['plan_older_files']}) |")
        top[f"{r['layout']} {r['history_days']} d"] = (r, base)
    rss_line = (f"| peak RSS streaming a {rss['file_bytes'] / 2**30:.2f} GiB Parquet file ({rss['rows']} rows) | "
                f"{rss['peak_rss_mib']} MiB (target <= 512) |")
    stamp = time.strftime("%Y-%m-%d %H:%M")
    text = (f"\n## landing_history ({stamp}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
            f"{platform.machine()}, {os.cpu_count()} cpus)\n\n" + "\n".join(lines) + "\n" + rss_line + "\n")
    print(text)
    arms = "; ".join(
        f"{name} / 3 d wall {r['seconds'] / b['seconds']:.2f}x CPU "
        f"{r['cpu_seconds'] / b['cpu_seconds']:.2f}x LISTs {r['landing_lists']} vs {b['landing_lists']} add_columns "
        f"mint {r['add_columns_mint_seconds'] / b['add_columns_mint_seconds']:.2f}x bytes "
        f"{r['landed_bytes'] / r['day_bytes']:.3f}x day GETs {r['landed_gets']} vs {b['landed_gets']} plan "
        f"{r['plan_bytes'] / b['plan_bytes']:.2f}x index read {r['index_read_bytes'] / b['index_read_bytes']:.2f}x"
        for name, (r, b) in top.items())
    print(f"FIGURE landing_history: {arms}; peak RSS {rss['peak_rss_mib']} MiB for "
          f"{rss['file_bytes'] / 2**30:.2f} GiB; load {load[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "landing_history.json").write_text(json.dumps({"runs": runs, "rss": rss, "loadavg": load}, indent=2))
    results_md = Path(__file__).resolve().parent / "RESULTS.md"
    with results_md.open("a") as fh:
        if results_md.stat().st_size == 0:
            fh.write("# Benchmark history\n")
        fh.write(text)


if __name__ == "__main__":
    main()
