"""A shard that lives long: 20,000 small appends with maintenance every 200, versus none.

Setup: two shards get the same N one-row appends (``--appends``, default 20,000). The
*maintained* one runs a maintenance pass every ``--every`` appends (default 200):
advance ``since`` by its retention (``--retention`` ms of time-travel; times are the
append index in ms), compact (size-tiered merges), sweep, and GC if the GC helper's
``shardsink.maintenance.gc`` exists (a no-op otherwise, see :func:`gc_step`). The
*unmaintained* one only appends. Histories are built the fast way (as
bench/commit_cost.py does): the library's own calls against a local folder on tmpfs,
then every object uploaded to a moto S3 server; all measurements are on S3.

Baselines in the same run: the unmaintained shard; a 10-append shard (commit latency at
10); the maintained shard's rows in ONE part (snapshot time).

Reported: live batches and parts, newest rollup bytes; objects and bytes in the store, and
their ratio to the objects the retained versions reference (versions, rollups, parts, hint);
whole-shard snapshot time (ratio to the one-part baseline); store requests per append
over a window of ``--window`` appends on S3 with maintenance (amortized, split into
staging, commit and maintenance); commit latency at N versus at 10 (fresh handle per
commit, like an Airflow task). Targets (maintained, at N): <= 64 live batches; rollup
<= 64 KB; objects <= 2x referenced; snapshot <= 1.5x one part; requests/append incl. maintenance <= 6; commit
latency <= 1.2x that at 10.

    python bench/long_life.py                  # 20,000 appends (~15 min on a busy 2-core box)
    python bench/long_life.py --appends 4000   # what fits
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import pyarrow as pa

from shardsink import Shard, StagedBatch
from shardsink.maintenance import MaintenanceOptions, compaction_pass, set_retention
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions, GcReport
from shardsink.maintenance.history import list_state, referenced, retained_start
from shardsink.storage.s3 import make_client
from shardsink_dev.testing import moto_server

BUCKET = "shardsink-bench"
WRITER = "bench-writer"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"live_batches": 64, "rollup_bytes": 64 * 1024, "objects_ratio": 2.0, "snapshot_ratio": 1.5,
           "requests_per_append": 6.0, "commit_latency_ratio": 1.2}


def one_row(i: int) -> pa.Table:
    return pa.table({"k": [i], "v": [f"row-{i}"], "_time": [i]},
                    schema=pa.schema([*SCHEMA, pa.field("_time", pa.int64())]))


def gc_step(shard: Shard) -> GcReport:
    """GC with no grace period: nothing is in flight in the bench (the default is an hour)."""
    return collect(shard, GcOptions(grace_s=0))


def maintenance_pass(shard: Shard) -> dict[str, Any]:
    """One pass: since, compaction, sweep of crashed leftovers, rollup (``compaction_pass``), then GC."""
    m = compaction_pass(shard, MaintenanceOptions(sweep_grace_s=3600))
    g = gc_step(shard)
    assert m.since is not None and m.compaction is not None
    return {"since": m.since.after, "merges": len(m.compaction.merges), "applied": m.compaction.applied,
            "swept": len(m.swept), "gc_deleted": g.objects_deleted}


def build_local(root: Path, n: int, *, every: int | None, retention: int) -> dict[str, Any]:
    shard = Shard.create(root.as_uri(), SCHEMA, upper=0, writer=WRITER)
    t0 = time.perf_counter()
    t_maint = 0.0
    passes = 0
    if every:
        set_retention(shard, retention)
    for i in range(n):
        r = shard.append(one_row(i), lower=i, upper=i + 1, desc_id=f"hist-{i:06d}", writer=WRITER)
        assert r.status == "committed", r
        if every and (i + 1) % every == 0:
            t1 = time.perf_counter()
            maintenance_pass(shard)
            t_maint += time.perf_counter() - t1
            passes += 1
    return {"appends": n, "build_s": time.perf_counter() - t0, "maintenance_s": t_maint, "passes": passes}


def upload(root: Path, prefix: str, client: Any) -> int:
    files = [p for p in root.rglob("*")
             if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)]

    def put(p: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(root).as_posix()}", Body=p.read_bytes())

    with ThreadPoolExecutor(max_workers=24) as pool:
        list(pool.map(put, files))
    return len(files)


def store_size(client: Any, prefix: str) -> dict[str, int]:
    objects = size = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
        for o in page.get("Contents", []):
            objects += 1
            size += o["Size"]
    return {"objects": objects, "bytes": size}


def referenced_objects(shard: Shard) -> dict[str, int]:
    """What the retained versions ``[oldest, head]`` need: themselves, the rollups at or above
    the oldest, the hint, and every part any of them references."""
    m = shard.admin()
    listing = list_state(m)
    head = m.head().seqno
    oldest = retained_start(m, listing, head)
    versions = sum(1 for s in listing.versions if oldest <= s <= head)
    rollups = sum(1 for r in listing.rollups if r >= oldest)
    parts = len(referenced(m, oldest, head, listing).parts)
    return {"oldest": oldest, "versions": versions, "rollups": rollups, "parts": parts,
            "total": versions + rollups + parts + 1}


def state_figures(url: str, client: Any, prefix: str) -> dict[str, Any]:
    shard = Shard(url)
    info = shard.info()
    batches = shard.batches()
    rollup = info.rollup
    rollup_bytes = (client.head_object(Bucket=BUCKET, Key=f"{prefix}/state/rollup/{rollup:020d}.json")["ContentLength"]
                    if rollup else 0)
    store = store_size(client, prefix)
    refs = referenced_objects(shard)
    return {"seqno": info.seqno, "upper": info.upper, "since": info.since, "live_batches": len(batches),
            "live_parts": sum(len(b.parts) for b in batches), "rows": info.stats.rows, "rollup_seqno": rollup,
            "rollup_bytes": rollup_bytes, "store": store, "referenced": refs,
            "objects_ratio": store["objects"] / refs["total"]}


def time_snapshots(url: str, reps: int) -> tuple[float, pa.Table]:
    times = []
    table = None
    for _ in range(reps):
        shard = Shard(url)  # fresh handle: no cached versions; construction not timed
        t0 = time.perf_counter()
        table = shard.snapshot()
        times.append(time.perf_counter() - t0)
    assert table is not None
    return statistics.median(times), table


def sorted_rows(t: pa.Table) -> list[dict[str, Any]]:
    return t.sort_by([("k", "ascending")]).to_pylist()


def commit_latency(urls: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    """``n`` pre-staged one-row commits per shard, interleaved, a fresh handle per commit."""
    staged: dict[str, list[StagedBatch]] = {}
    uppers: dict[str, int] = {}
    for name, url in urls.items():
        s = Shard(url)
        up = s.info().upper
        assert up is not None
        uppers[name] = up
        staged[name] = [s.stage(one_row(up + j), lower=up + j, upper=up + j + 1, desc_id=f"lat-{name}-{up + j}")
                        for j in range(n)]
    took: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for j in range(n):
        for name in names if j % 2 == 0 else names[::-1]:
            shard = Shard(urls[name])
            lo = uppers[name] + j
            t0 = time.perf_counter()
            r = shard.compare_and_append([staged[name][j]], expected_upper=lo, new_upper=lo + 1,
                                         desc_id=staged[name][j].desc_id, writer=WRITER)
            took[name].append(time.perf_counter() - t0)
            assert r.status == "committed", r
    return {name: {"p50_ms": statistics.median(xs) * 1e3, "mean_ms": statistics.fmean(xs) * 1e3}
            for name, xs in took.items()}


def requests(shard: Shard) -> int:
    """Requests the handle's store has sent (its public counter: every try, a LIST once)."""
    return shard.request_counter().total


def request_window(url: str, appends: int, every: int | None, *, fresh: bool = False) -> dict[str, Any]:
    """``appends`` one-row appends (stage + compare_and_append, a long-lived writer handle)
    with a maintenance pass every ``every`` (its own long-lived handle, like a separate
    long-running maintainer; ``fresh``: a new handle per pass, like an Airflow task)."""
    writer, maint = Shard(url), Shard(url)
    start = writer.info().upper
    assert start is not None
    w0 = requests(writer)
    stage_req = commit_req = maint_req = 0
    t_maint = 0.0
    for j in range(appends):
        lo = start + j
        r0 = requests(writer)
        staged = writer.stage(one_row(lo), lower=lo, upper=lo + 1, desc_id=f"win-{lo}", schema=SCHEMA)
        r1 = requests(writer)
        res = writer.compare_and_append([staged], expected_upper=lo, new_upper=lo + 1, desc_id=f"win-{lo}",
                                        writer=WRITER)
        assert res.status == "committed", res
        stage_req += r1 - r0
        commit_req += requests(writer) - r1
        if every and (j + 1) % every == 0:
            if fresh:
                maint = Shard(url)
            m0, t0 = requests(maint), time.perf_counter()
            maintenance_pass(maint)
            maint_req += requests(maint) - m0
            t_maint += time.perf_counter() - t0
    total = requests(writer) - w0 + maint_req
    return {"appends": appends, "stage_per_append": stage_req / appends, "commit_per_append": commit_req / appends,
            "maintenance_per_append": maint_req / appends, "total_per_append": total / appends,
            "commit_and_maintenance_per_append": (commit_req + maint_req) / appends,
            "maintenance_s_per_pass": t_maint / max(1, appends // every) if every else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--every", type=int, default=200, help="maintenance every this many appends")
    ap.add_argument("--retention", type=int, default=5_000, help="retention (ms; times are append indexes)")
    ap.add_argument("--window", type=int, default=400, help="appends measured for requests on S3")
    ap.add_argument("--commits", type=int, default=40, help="timed commits per shard for latency")
    ap.add_argument("--reps", type=int, default=5, help="snapshot repetitions (median)")
    ap.add_argument("--no-unmaintained", action="store_true",
                    help="skip the unmaintained shard (its build dominates: rollups grow with history)")
    args = ap.parse_args()
    n, every = args.appends, args.every
    load_start = os.getloadavg()
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-long-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    res: dict[str, Any] = {}
    try:
        builds = {}
        kinds = [("maintained", every), ("unmaintained", None), ("short", None)]
        for name, ev in [k for k in kinds if not (args.no_unmaintained and k[0] == "unmaintained")]:
            k = 10 if name == "short" else n
            builds[name] = build_local(scratch / name, k, every=ev, retention=args.retention)
            print(f"built {name}: {k} appends in {builds[name]['build_s']:.0f}s "
                  f"(maintenance {builds[name]['maintenance_s']:.0f}s in {builds[name]['passes']} passes)", flush=True)
        with moto_server() as server:
            server.make_bucket(BUCKET)
            os.environ.update(server.env())
            client = make_client()
            for name in builds:
                t0 = time.perf_counter()
                count = upload(scratch / name, name, client)
                shutil.rmtree(scratch / name)
                print(f"uploaded {name}: {count} objects in {time.perf_counter() - t0:.0f}s", flush=True)
            urls = {name: f"s3://{BUCKET}/{name}" for name in builds}
            shards = [x for x in ("maintained", "unmaintained") if x in urls]
            for name in shards:
                res[name] = state_figures(urls[name], client, name)
                print(f"{name}: {res[name]}", flush=True)
            # The same rows in one part.
            snap_m_s, snap_m = time_snapshots(urls["maintained"], args.reps)
            if "unmaintained" in urls:
                snap_u_s, snap_u = time_snapshots(urls["unmaintained"], 1)
                if sorted_rows(snap_m) != sorted_rows(snap_u):
                    raise SystemExit("the maintained shard's snapshot differs from the unmaintained one's")
            else:
                snap_u_s = float("nan")
            expected = [{"k": i, "v": f"row-{i}", "_count": 1} for i in range(n)]
            if sorted_rows(snap_m) != expected:
                raise SystemExit("the maintained shard's snapshot is not the appended rows")
            one = Shard.create(f"s3://{BUCKET}/one-part", SCHEMA, upper=0)
            rows = snap_m.drop_columns(["_count"]).append_column("_time", pa.array([0] * snap_m.num_rows, pa.int64()))
            one.append(rows, lower=0, upper=n, desc_id="all-rows")
            assert len(one.batches()) == 1 and len(one.batches()[0].parts) == 1
            snap_1_s, _ = time_snapshots(f"s3://{BUCKET}/one-part", args.reps)
            res["snapshot"] = {"maintained_s": snap_m_s, "unmaintained_s": snap_u_s, "one_part_s": snap_1_s,
                               "rows": snap_m.num_rows, "ratio_maintained": snap_m_s / snap_1_s,
                               "ratio_unmaintained": snap_u_s / snap_1_s}
            print(f"snapshot: {res['snapshot']}", flush=True)
            res["commit_latency"] = commit_latency(urls, args.commits)
            print(f"commit latency: {res['commit_latency']}", flush=True)
            res["requests"] = {"maintained": request_window(urls["maintained"], args.window, every),
                               "maintained_fresh": request_window(urls["maintained"], args.window, every, fresh=True)}
            if "unmaintained" in urls:
                res["requests"]["unmaintained"] = request_window(urls["unmaintained"], args.window, None)
            print(f"requests: {res['requests']}", flush=True)
            res["after_window"] = {name: state_figures(urls[name], client, name) for name in shards}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    nan: dict[str, Any] = {"p50_ms": float("nan"), "mean_ms": float("nan"), "total_per_append": float("nan"),
                           "commit_per_append": float("nan"), "commit_and_maintenance_per_append": float("nan")}
    blank = {"live_batches": -1, "live_parts": -1, "rollup_bytes": -1, "since": -1,
             "store": {"objects": -1, "bytes": -1}}  # skipped: printed as -1
    m, u, lat = res["maintained"], res.get("unmaintained", blank), res["commit_latency"]
    lat.setdefault("unmaintained", nan)
    res["requests"].setdefault("unmaintained", nan)
    lat_ratio = lat["maintained"]["p50_ms"] / lat["short"]["p50_ms"]
    lat_ratio_mean = lat["maintained"]["mean_ms"] / lat["short"]["mean_ms"]
    req = res["requests"]["maintained"]["total_per_append"]
    got = {"live_batches": m["live_batches"], "rollup_bytes": m["rollup_bytes"], "objects_ratio": m["objects_ratio"],
           "snapshot_ratio": res["snapshot"]["ratio_maintained"], "requests_per_append": req,
           "commit_latency_ratio": lat_ratio}
    verdicts = {k: got[k] <= TARGETS[k] for k in TARGETS}
    got_excl = res["requests"]["maintained"]["commit_and_maintenance_per_append"]
    print()
    print(f"{n} one-row appends; maintenance every {every} (retention {args.retention} ms) vs none; moto S3")
    print(f"{'':38s}{'maintained':>16s}{'unmaintained':>16s}")
    for k, label in (("live_batches", "live batches"), ("live_parts", "live parts"), ("rollup_bytes", "rollup bytes"),
                     ("since", "since")):
        print(f"{label:38s}{m[k]:>16,}{u[k]:>16,}")
    print(f"{'objects in the store':38s}{m['store']['objects']:>16,}{u['store']['objects']:>16,}")
    print(f"{'bytes in the store':38s}{m['store']['bytes']:>16,}{u['store']['bytes']:>16,}")
    mr = m.get("referenced", {"total": -1, "versions": -1, "parts": -1})
    ur = u.get("referenced", {"total": -1, "versions": -1, "parts": -1})
    print(f"{'objects retained versions reference':38s}{mr['total']:>16,}{ur['total']:>16,}"
          f"   (maintained: {mr['versions']:,} versions + {mr['parts']:,} parts + rollups + hint)")
    print(f"{'objects / referenced':38s}{m.get('objects_ratio', -1):>16.2f}{u.get('objects_ratio', -1):>16.2f}")
    s = res["snapshot"]
    print(f"{'snapshot, whole shard (median)':38s}{s['maintained_s'] * 1e3:>13.0f} ms"
          f"{s['unmaintained_s'] * 1e3:>13.0f} ms   one part: {s['one_part_s'] * 1e3:.0f} ms")
    print(f"{'commit latency p50 / mean':38s}{lat['maintained']['p50_ms']:>8.1f}/{lat['maintained']['mean_ms']:.1f} ms"
          f"{lat['unmaintained']['p50_ms']:>8.1f}/{lat['unmaintained']['mean_ms']:.1f} ms"
          f"   at 10: {lat['short']['p50_ms']:.1f}/{lat['short']['mean_ms']:.1f} ms")
    rm, ru = res["requests"]["maintained"], res["requests"]["unmaintained"]
    print(f"requests/append over {args.window} appends: maintained {rm['total_per_append']:.2f} (stage "
          f"{rm['stage_per_append']:.2f} + commit {rm['commit_per_append']:.2f} + maintenance "
          f"{rm['maintenance_per_append']:.2f}); unmaintained {ru['total_per_append']:.2f} (commit "
          f"{ru['commit_per_append']:.2f}, incl. its rollups)")
    rf = res["requests"]["maintained_fresh"]
    print(f"  with a fresh maintenance handle per pass (an Airflow task): {rf['total_per_append']:.2f} (maintenance "
          f"{rf['maintenance_per_append']:.2f})")
    print(f"  without the part PUT (commit + maintenance): maintained {rm['commit_and_maintenance_per_append']:.2f}, "
          f"unmaintained {ru['commit_and_maintenance_per_append']:.2f}")
    print()
    for k, label in (("live_batches", "live batches"), ("rollup_bytes", "rollup bytes"),
                     ("objects_ratio", "objects in the store / referenced"), ("snapshot_ratio", "snapshot / one part"),
                     ("requests_per_append", "requests per append"),
                     ("commit_latency_ratio", f"commit latency p50 at {n} / at 10")):
        print(f"VERDICT {label}: {got[k]:.2f} (target <= {TARGETS[k]}): {'MET' if verdicts[k] else 'MISSED'}")
    print(f"(requests per append without the part's own PUT: {got_excl:.2f}, "
          f"{'within' if got_excl <= TARGETS['requests_per_append'] else 'above'} the target)")
    print(f"(commit latency mean ratio {lat_ratio_mean:.2f}; unmaintained p50 ratio "
          f"{lat['unmaintained']['p50_ms'] / lat['short']['p50_ms']:.2f})")
    doc = {"name": "long_life", "config": {**vars(args), "backend": "moto S3", "python": platform.python_version(),
                                           "pyarrow": pa.__version__, "cpus": os.cpu_count(),
                                           "gc": True},
           "build": builds, "results": res, "figures": got, "targets": TARGETS, "verdicts": verdicts,
           "wall_s": time.perf_counter() - started, "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]]}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("long_life.json" if n == 20_000 else f"long_life_{n}.json")
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; wrote {out} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
