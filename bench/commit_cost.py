"""Commit cost versus history length, on a real (moto) S3 endpoint.

Builds two shards on one moto server, one with a short history (10 prior commits) and
one with a long history (2,000 prior commits; every commit a real 1-row batch with one
part), then times N uncontended ``compare_and_append`` commits of pre-staged 1-row
batches on each, interleaved, each from a *fresh* ``Shard(url)`` handle (a new boto3
client and an empty version cache, like an Airflow append task in a new process).

Reported per shard: handle construction time (boto3 client; not part of the commit),
commit latency p50/mean/p95 with and without the rollup maintenance that runs inside
the commit on every 32nd commit, and S3 requests per commit (own requests vs
maintenance), counted by the store's public request counter (``shard.blob.counter``).
Ratios long/short; targets: latency ratio <= 1.2, requests <= 4.

Building the long history: the library's own ``Shard.append`` runs against a local
folder on tmpfs (same code path, same objects, only the backend differs), then every
object is uploaded to S3 under the shard prefix. A cross-check builds a 40-commit shard
both ways (real S3 appends vs the fast path) and asserts that the state objects are
identical up to nonces, timestamps and random part names.

    python bench/commit_cost.py            # full run (~1-2 min)
    python bench/commit_cost.py --quick    # smaller history and fewer commits
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import pyarrow as pa

from shardsink import Shard, StagedBatch
from shardsink.storage.retry import RequestCounter, RetryingBlob
from shardsink.storage.s3 import make_client
from shardsink_dev.testing import moto_server

BUCKET = "shardsink-bench"
WRITER = "bench-writer"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
RESULTS = Path(__file__).resolve().parent / "results"
TARGET_LATENCY_RATIO = 1.2
TARGET_REQUESTS = 4


def one_row(i: int) -> pa.Table:
    return pa.table({"k": [i], "v": [f"row-{i}"], "_time": [i]},
                    schema=pa.schema([*SCHEMA, pa.field("_time", pa.int64())]))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": pct(xs, 0.5), "mean": statistics.fmean(xs), "p95": pct(xs, 0.95), "max": max(xs)}


# --- building history -----------------------------------------------------------------


def build_local(root: Path, commits: int) -> None:
    """``commits`` real appends through the library against a local folder shard."""
    shard = Shard.create(root.as_uri(), SCHEMA, upper=0, writer=WRITER)
    for i in range(commits):
        r = shard.append(one_row(i), lower=i, upper=i + 1, desc_id=f"hist-{i:06d}", writer=WRITER)
        assert r.status == "committed", r


def upload(root: Path, prefix: str, client: Any) -> int:
    """Copy every object of a local shard folder to s3://BUCKET/prefix/ (parallel PUTs)."""
    files = [p for p in root.rglob("*")
             if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)]

    def put(p: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(root).as_posix()}", Body=p.read_bytes())

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, files))
    return len(files)


def build_fast(prefix: str, commits: int, client: Any, scratch: Path) -> float:
    t0 = time.perf_counter()
    root = scratch / prefix
    build_local(root, commits)
    upload(root, prefix, client)
    shutil.rmtree(root)
    return time.perf_counter() - t0


def build_real(url: str, commits: int) -> float:
    t0 = time.perf_counter()
    shard = Shard.create(url, SCHEMA, upper=0, writer=WRITER)
    for i in range(commits):
        shard.append(one_row(i), lower=i, upper=i + 1, desc_id=f"hist-{i:06d}", writer=WRITER)
    return time.perf_counter() - t0


_UUID = re.compile(r"[0-9a-f]{32}")
_SEQNO = re.compile(r"\d{20}")


def normalized_state(prefix: str, client: Any) -> dict[str, Any]:
    """State objects of an S3 shard with nonces, timestamps and random part names blanked."""
    out: dict[str, Any] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
    for page in pages:
        for obj in page.get("Contents", []):
            key = obj["Key"][len(prefix) + 1:]
            if key.startswith("parts/"):
                out.setdefault("parts", Counter())[_UUID.sub("U", key)] += 1
                continue
            doc = json.loads(client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read())
            text = json.dumps(doc, sort_keys=True)
            text = re.sub(r'"(nonce|at)": "[^"]*"', r'"\1": ""', text)
            out[key] = _UUID.sub("U", text)
    return out


def check_fast_path(client: Any, scratch: Path) -> dict[str, Any]:
    """Build 40 commits (crossing a rollup) both ways and compare the resulting state."""
    n = 40
    t_real = build_real(f"s3://{BUCKET}/check-real", n)
    t_fast = build_fast("check-fast", n, client, scratch)
    real, fast = normalized_state("check-real", client), normalized_state("check-fast", client)
    if real != fast:
        diff = sorted(k for k in set(real) | set(fast) if real.get(k) != fast.get(k))
        raise SystemExit(f"fast-path history differs from real commits in {diff[:5]}")
    return {"commits": n, "objects": sum(1 for k in real if k != "parts") + sum(real["parts"].values()),
            "real_s": t_real, "fast_s": t_fast, "identical": True}


# --- measuring ------------------------------------------------------------------------


class Probe(RequestCounter):
    """The public request counter of one fresh handle's store (``shard.blob.counter``), which
    also logs each request (method, key, time) in order.

    A commit's own requests end with its hint update (the first ``replace`` of
    ``state/LATEST.json``); a commit that writes a rollup (a ``put`` under ``state/rollup``)
    then reads the batch list, puts the rollup and moves the hint again: those are the
    rollup's requests, timed from the first of them to the end of the commit.
    """

    def __init__(self, shard: Shard) -> None:
        super().__init__()
        blob = shard.blob
        assert isinstance(blob, RetryingBlob)
        blob.counter = self
        self.log: list[tuple[str, str, float]] = []

    def count(self, method: str, key: str) -> None:
        super().count(method, key)
        self.log.append((method, key, time.perf_counter()))

    def split(self, end: float) -> tuple[list[str], int, float]:
        """The commit's own requests (``method key``, seqnos as N), the rollup's request count and time."""
        own = len(self.log)
        if self.by_kind[("put", "state/rollup")]:
            own = next((i + 1 for i, (m, k, _) in enumerate(self.log) if (m, k) == ("replace", "state/LATEST.json")),
                       own)
        kinds = [f"{m} {_SEQNO.sub('N', k)}" for m, k, _ in self.log[:own]]
        rollup = self.log[own:]
        return kinds, len(rollup), (end - rollup[0][2]) if rollup else 0.0


def stage_batches(url: str, start: int, n: int) -> list[StagedBatch]:
    stager = Shard(url)
    return [stager.stage(one_row(start + j), lower=start + j, upper=start + j + 1, desc_id=f"bench-{start + j:06d}")
            for j in range(n)]


def measure(urls: dict[str, str], history: dict[str, int], n: int) -> dict[str, dict[str, Any]]:
    staged = {name: stage_batches(url, history[name], n) for name, url in urls.items()}
    rec: dict[str, dict[str, list[Any]]] = {
        name: {"construct": [], "total": [], "own": [], "own_req": [], "rollup_req": [], "rollup_s": [], "kinds": []}
        for name in urls
    }
    names = list(urls)
    for j in range(n):
        order = names if j % 2 == 0 else names[::-1]  # alternate to spread drift evenly
        for name in order:
            t0 = time.perf_counter()
            shard = Shard(urls[name])  # fresh boto3 client, empty caches
            t1 = time.perf_counter()
            probe = Probe(shard)
            t2 = time.perf_counter()
            lower = history[name] + j
            res = shard.compare_and_append([staged[name][j]], expected_upper=lower, new_upper=lower + 1,
                                           desc_id=staged[name][j].desc_id, writer=WRITER)
            t3 = time.perf_counter()
            if res.status != "committed":
                raise SystemExit(f"{name}: commit {j} was {res.status}")
            kinds, rollup_requests, rollup_s = probe.split(t3)
            r = rec[name]
            r["construct"].append(t1 - t0)
            r["total"].append(t3 - t2)
            r["own"].append(t3 - t2 - rollup_s)
            r["own_req"].append(probe.total - rollup_requests)
            r["rollup_req"].append(rollup_requests)
            r["rollup_s"].append(rollup_s)
            r["kinds"].append(kinds)
    out: dict[str, dict[str, Any]] = {}
    for name, r in rec.items():
        rollups = [x for x in r["rollup_req"] if x]
        typical = Counter(" | ".join(k) for k in r["kinds"]).most_common(1)[0]
        out[name] = {
            "history": history[name],
            "commits": n,
            "construct_ms": {k: v * 1e3 for k, v in summary(r["construct"]).items()},
            "commit_own_ms": {k: v * 1e3 for k, v in summary(r["own"]).items()},
            "commit_total_ms": {k: v * 1e3 for k, v in summary(r["total"]).items()},
            "construct_plus_commit_ms": {
                k: v * 1e3 for k, v in summary([a + b for a, b in zip(r["construct"], r["total"], strict=True)]).items()
            },
            "own_requests": {"mean": statistics.fmean(r["own_req"]), "max": max(r["own_req"]),
                             "min": min(r["own_req"])},
            "rollups": len(rollups),
            "rollup_requests_each": rollups,
            "rollup_ms_each": [x * 1e3 for x, q in zip(r["rollup_s"], r["rollup_req"], strict=True) if q],
            "requests_per_commit_incl_rollup": (sum(r["own_req"]) + sum(r["rollup_req"])) / n,
            "typical_commit_requests": typical[0],
            "typical_commit_share": typical[1] / n,
        }
    return out


def verify(url: str, commits: int) -> None:
    shard = Shard(url)
    info = shard.info()
    snap = shard.snapshot()
    if info.seqno != commits or info.stats.batches != commits or snap.num_rows != commits:
        raise SystemExit(f"{url}: seqno {info.seqno}, batches {info.stats.batches}, rows {snap.num_rows}; "
                         f"expected {commits} each")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="history 300 instead of 2000, 30 timed commits")
    ap.add_argument("--history", type=int, help="prior commits of the long shard (default 2000)")
    ap.add_argument("--commits", type=int, help="timed commits per shard (default 100)")
    args = ap.parse_args()
    short = 10
    long_ = args.history or (300 if args.quick else 2000)
    n = args.commits or (30 if args.quick else 100)

    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    started = time.perf_counter()
    load_start = os.getloadavg()
    try:
        with moto_server() as server:
            server.make_bucket(BUCKET)
            os.environ.update(server.env())
            client = make_client()
            print(f"moto S3 at {server.endpoint}; building histories ({short} and {long_} commits)", flush=True)
            check = check_fast_path(client, scratch)
            print(f"fast-path check: {check['commits']} commits built both ways -> identical state "
                  f"(real {check['real_s']:.1f}s, fast {check['fast_s']:.1f}s)", flush=True)
            build = {}
            for name, k in (("short", short), ("long", long_)):
                build[name] = build_fast(name, k, client, scratch)
                print(f"built {name}: {k} commits in {build[name]:.1f}s", flush=True)
            urls = {"short": f"s3://{BUCKET}/short", "long": f"s3://{BUCKET}/long"}
            history = {"short": short, "long": long_}
            for name in urls:
                verify(urls[name], history[name])
            res = measure(urls, history, n)
            for name in urls:
                verify(urls[name], history[name] + n)
                newest = Shard(urls[name]).info().rollup
                head = client.head_object(Bucket=BUCKET, Key=f"{name}/state/rollup/{newest:020d}.json")
                latest = client.head_object(Bucket=BUCKET, Key=f"{name}/state/LATEST.json")
                res[name]["newest_rollup"] = {"seqno": newest, "bytes": head["ContentLength"]}
                res[name]["latest_hint_bytes"] = latest["ContentLength"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    s, lg = res["short"], res["long"]

    def ratio(metric: str, stat: str) -> float:
        return float(lg[metric][stat] / s[metric][stat])

    ratios = {f"{m}.{st}": ratio(m, st) for m in ("commit_own_ms", "commit_total_ms", "construct_plus_commit_ms")
              for st in ("p50", "mean", "p95")}
    print()
    print(f"{n} uncontended compare_and_append commits per shard, fresh Shard(url) per commit, moto S3")
    hdr = f"{'':34s}{'history ' + str(short):>22s}{'history ' + str(long_):>22s}{'ratio':>8s}"
    print(hdr)
    for metric, label in (("construct_ms", "handle construction (boto3)"),
                          ("commit_own_ms", "commit, own work"),
                          ("commit_total_ms", "commit incl. rollup maintenance"),
                          ("construct_plus_commit_ms", "construction + commit")):
        for st in ("p50", "mean", "p95"):
            a, b = s[metric][st], lg[metric][st]
            print(f"{label + ' ' + st:34s}{a:19.1f} ms{b:19.1f} ms{b / a:8.2f}")
    for name, r in (("short", s), ("long", lg)):
        print(f"requests/commit [{name}]: own mean {r['own_requests']['mean']:.2f} "
              f"(min {r['own_requests']['min']}, max {r['own_requests']['max']}); "
              f"{r['rollups']} rollups costing {r['rollup_requests_each']} requests, "
              f"{', '.join(f'{x:.0f}' for x in r['rollup_ms_each'])} ms; "
              f"amortized incl. rollup {r['requests_per_commit_incl_rollup']:.2f}")
    for name, r in (("short", s), ("long", lg)):
        print(f"object sizes [{name}]: LATEST.json {r['latest_hint_bytes']:,} B, newest rollup "
              f"(seqno {r['newest_rollup']['seqno']}) {r['newest_rollup']['bytes']:,} B")
    print(f"typical commit ({lg['typical_commit_share']:.0%} of long-history commits): {lg['typical_commit_requests']}")

    lat_ok = max(ratios["commit_own_ms.p50"], ratios["commit_own_ms.mean"]) <= TARGET_LATENCY_RATIO
    lat_total_ok = ratios["commit_total_ms.mean"] <= TARGET_LATENCY_RATIO
    req_ok = max(s["own_requests"]["max"], lg["own_requests"]["max"]) <= TARGET_REQUESTS
    verdicts = {
        "latency_ratio_own": lat_ok,
        "latency_ratio_incl_rollup_mean": lat_total_ok,
        "requests_per_commit_own": req_ok,
    }
    print()
    print(f"VERDICT latency@{long_}/latency@{short} (own commit) p50 {ratios['commit_own_ms.p50']:.2f}, "
          f"mean {ratios['commit_own_ms.mean']:.2f} (target <= {TARGET_LATENCY_RATIO}): "
          f"{'MET' if lat_ok else 'MISSED'}")
    print(f"VERDICT latency ratio incl. rollup maintenance, mean {ratios['commit_total_ms.mean']:.2f} "
          f"(target <= {TARGET_LATENCY_RATIO}): {'MET' if lat_total_ok else 'MISSED'}")
    print(f"VERDICT requests per commit (own) max {max(s['own_requests']['max'], lg['own_requests']['max'])} "
          f"(target <= {TARGET_REQUESTS}; amortized incl. rollup {lg['requests_per_commit_incl_rollup']:.2f}): "
          f"{'MET' if req_ok else 'MISSED'}")

    doc = {
        "name": "commit_cost",
        "quick": args.quick,
        "config": {"short_history": short, "long_history": long_, "timed_commits": n, "backend": "moto S3",
                   "fresh_handle_per_commit": True, "python": platform.python_version(),
                   "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "fast_path_check": check,
        "build_s": build,
        "results": res,
        "ratios_long_over_short": ratios,
        "targets": {"latency_ratio": TARGET_LATENCY_RATIO, "requests_per_commit": TARGET_REQUESTS},
        "verdicts": verdicts,
        "wall_s": time.perf_counter() - started,
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "commit_cost.json").write_text(json.dumps(doc, indent=2, default=str))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"wrote {RESULTS / 'commit_cost.json'} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
