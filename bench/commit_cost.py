"""Commit cost versus history length, on a real (moto) S3 endpoint.

Builds shards on one moto server, one with a short history (10 prior commits) and one per
long history (default 2,000 and 20,000 prior commits; every commit a real 1-row batch with
one part), then times N uncontended ``compare_and_append`` commits of pre-staged 1-row
batches on each, interleaved round by round, each from a *fresh* ``Shard(url)`` handle (a
new boto3 client and an empty version cache, like an Airflow append task in a new process).

Reported per shard: handle construction time (boto3 client; not part of the commit),
commit latency p50/mean/p95 with and without the rollup maintenance that runs inside the
commit on every 32nd commit, and S3 requests per commit (own requests vs maintenance),
counted by the handle's public request counter: each handle is opened with a ``counter``
(``Shard(url, counter=...)``), a :class:`RequestCounter` subclass logging each request (no
private method is replaced). Ratios long/short; targets: latency ratio <= 1.2,
requests <= 4. A cProfile of the long shards' rollup commits shows where their time goes.

Building a long history: the library's own ``Shard.append`` runs against a local folder
on tmpfs (same code path, same objects, only the backend differs; progress printed),
then its objects are uploaded to S3 under the shard prefix, except rollups older than
the newest one (no commit or read of a newer version reads them; at 20,000 commits they
would be 1.2 GB). A cross-check builds a 40-commit shard both ways (real S3 appends vs the
fast path) and asserts that the state objects are identical up to nonces, timestamps and
random part names. Bounds: a build or an arm's timed commits that pass ``--max-seconds``
stop there, and the report says CUT SHORT (the history or commit count actually reached).

    python bench/commit_cost.py                        # 10 vs 2,000 and 20,000 (several minutes)
    python bench/commit_cost.py --quick                # 10 vs 300, 30 commits
    python bench/commit_cost.py --histories 2000 --commits 64
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import pyarrow as pa
from _history import BUCKET, WRITER, build_fast, check_fast_path, one_row

from shardsink import Shard, StagedBatch
from shardsink.storage.retry import RequestCounter
from shardsink.storage.s3 import make_client
from shardsink_dev.testing import moto_server

_SEQNO = re.compile(r"\d{20}")
RESULTS = Path(__file__).resolve().parent / "results"
TARGET_LATENCY_RATIO = 1.2
TARGET_REQUESTS = 4
SHORT = 10
SNAPSHOT_MAX = 2000  # read every part back only up to this history (else check the header's stats)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": pct(xs, 0.5), "mean": statistics.fmean(xs), "p95": pct(xs, 0.95), "max": max(xs)}


# --- measuring ------------------------------------------------------------------------


class Probe(RequestCounter):
    """The public request counter of one fresh handle (``Shard(url, counter=probe)``),
    which also logs each request (method, key, time) in order.

    A commit's own requests end with its hint update (the first ``replace`` of
    ``state/LATEST.json``); a commit that writes a rollup (a ``put`` under ``state/rollup``)
    then reads the batch list, puts the rollup and moves the hint again: those are the
    rollup's requests, timed from the first of them to the end of the commit.
    """

    def __init__(self) -> None:
        super().__init__()
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


def probed_shard(url: str) -> tuple[Shard, Probe]:
    """A fresh handle (new boto3 client, empty caches) on a store whose counter is a probe."""
    probe = Probe()
    return Shard(url, counter=probe), probe


def stage_batches(url: str, start: int, n: int) -> list[StagedBatch]:
    stager = Shard(url)
    return [stager.stage(one_row(start + j), lower=start + j, upper=start + j + 1, desc_id=f"bench-{start + j:06d}")
            for j in range(n)]


def measure(urls: dict[str, str], history: dict[str, int], n: int, bound_s: float) -> dict[str, dict[str, Any]]:
    """``n`` timed commits per shard, round by round (order alternating); a shard whose own
    commit time passes ``bound_s`` stops (CUT SHORT) while the others go on."""
    staged = {name: stage_batches(url, history[name], n) for name, url in urls.items()}
    keys = ("construct", "total", "own", "own_req", "rollup_req", "rollup_s", "kinds")
    rec: dict[str, dict[str, list[Any]]] = {name: {k: [] for k in keys} for name in urls}
    cut: dict[str, int] = {}
    names, t_start = list(urls), time.perf_counter()
    for j in range(n):
        for name in (names if j % 2 == 0 else names[::-1]):  # alternate to spread drift evenly
            if name in cut:
                continue
            t0 = time.perf_counter()
            shard, probe = probed_shard(urls[name])
            t1 = time.perf_counter()
            lower = history[name] + j
            res = shard.compare_and_append([staged[name][j]], expected_upper=lower, new_upper=lower + 1,
                                           desc_id=staged[name][j].desc_id, writer=WRITER)
            t2 = time.perf_counter()
            if res.status != "committed":
                raise SystemExit(f"{name}: commit {j} was {res.status}")
            kinds, rollup_requests, rollup_s = probe.split(t2)
            r = rec[name]
            for key, val in (("construct", t1 - t0), ("total", t2 - t1), ("own", t2 - t1 - rollup_s),
                             ("own_req", probe.total - rollup_requests), ("rollup_req", rollup_requests),
                             ("rollup_s", rollup_s), ("kinds", kinds)):
                r[key].append(val)
            if sum(r["total"]) > bound_s:
                cut[name] = j + 1
                print(f"  CUT SHORT: {name} passed --max-seconds after {j + 1} timed commits", flush=True)
        if (j + 1) % 10 == 0:
            print(f"  [{time.perf_counter() - t_start:.0f}s, load {os.getloadavg()[0]:.1f}] {j + 1}/{n} rounds: "
                  + "; ".join(f"{k} mean {statistics.fmean(r['total']) * 1e3:.0f} ms" for k, r in rec.items()),
                  flush=True)
    return {name: digest(r, history[name], cut.get(name)) for name, r in rec.items()}


def digest(r: dict[str, list[Any]], history: int, cut: int | None) -> dict[str, Any]:
    n = len(r["total"])
    rollups = [x for x in r["rollup_req"] if x]
    typical = Counter(" | ".join(k) for k in r["kinds"]).most_common(1)[0]

    def ms(xs: list[float]) -> dict[str, float]:
        return {k: v * 1e3 for k, v in summary(xs).items()}

    return {
        "history": history, "commits": n, "cut_short_at": cut,
        "construct_ms": ms(r["construct"]), "commit_own_ms": ms(r["own"]), "commit_total_ms": ms(r["total"]),
        "construct_plus_commit_ms": ms([a + b for a, b in zip(r["construct"], r["total"], strict=True)]),
        "own_requests": {"mean": statistics.fmean(r["own_req"]), "max": max(r["own_req"]), "min": min(r["own_req"])},
        "rollups": len(rollups), "rollup_requests_each": rollups,
        "rollup_ms_each": [x * 1e3 for x, q in zip(r["rollup_s"], r["rollup_req"], strict=True) if q],
        "requests_per_commit_incl_rollup": (sum(r["own_req"]) + sum(r["rollup_req"])) / n,
        "typical_commit_requests": typical[0], "typical_commit_share": typical[1] / n,
    }


def profile_commits(url: str, start: int, n: int) -> dict[str, Any]:
    """cProfile ``n`` more fresh-handle commits (32: one of them writes a rollup) on ``url``."""
    staged = stage_batches(url, start, n)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    for j, b in enumerate(staged):
        shard, _ = probed_shard(url)
        prof.enable()
        shard.compare_and_append([b], expected_upper=start + j, new_upper=start + j + 1, desc_id=b.desc_id,
                                 writer=WRITER)
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(r"shardsink|msgspec|json|socket", 22)
    return {"commits": n, "wall_s": time.perf_counter() - t0, "top_cumulative": out.getvalue()}


def verify(url: str, commits: int) -> None:
    shard = Shard(url)
    info = shard.info()
    rows = shard.snapshot().num_rows if commits <= SNAPSHOT_MAX else info.stats.rows
    if info.seqno != commits or info.stats.batches != commits or rows != commits:
        raise SystemExit(f"{url}: seqno {info.seqno}, batches {info.stats.batches}, rows {rows}; "
                         f"expected {commits} each")


def object_sizes(client: Any, name: str, url: str) -> dict[str, Any]:
    newest = Shard(url).info().rollup
    latest = client.head_object(Bucket=BUCKET, Key=f"{name}/state/LATEST.json")["ContentLength"]
    rollup = client.head_object(Bucket=BUCKET, Key=f"{name}/state/rollup/{newest:020d}.json")["ContentLength"] \
        if newest > 0 else 0
    return {"newest_rollup": {"seqno": newest, "bytes": rollup}, "latest_hint_bytes": latest}


def run(histories: list[int], n: int, bound_s: float, profile: bool) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        with moto_server() as server:
            server.make_bucket(BUCKET)
            os.environ.update(server.env())
            client = make_client()
            print(f"moto S3 at {server.endpoint}; building histories {histories}", flush=True)
            check = check_fast_path(client, scratch)
            print(f"fast-path check: {check['commits']} commits built both ways -> identical state "
                  f"(real {check['real_s']:.1f}s, fast {check['fast_s']:.1f}s)", flush=True)
            build, history = {}, {}
            for k in histories:
                name = f"h{k}"
                build[name], history[name] = build_fast(name, k, client, scratch, bound_s=bound_s)
                print(f"built {name}: {history[name]} commits in {build[name]:.1f}s", flush=True)
            urls = {name: f"s3://{BUCKET}/{name}" for name in history}
            for name in urls:
                verify(urls[name], history[name])
            res = measure(urls, history, n, bound_s)
            for name in urls:
                verify(urls[name], history[name] + res[name]["commits"])
                res[name].update(object_sizes(client, name, urls[name]))
            prof = None
            if profile:
                longest = max(history, key=lambda x: history[x])
                print(f"profiling 32 more commits on {longest}", flush=True)
                prof = {"shard": longest, **profile_commits(urls[longest], history[longest] + res[longest]["commits"],
                                                            32)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"check": check, "build": build, "history": history, "res": res, "profile": prof}


def report(out: dict[str, Any], n: int) -> tuple[dict[str, dict[str, float]], dict[str, bool]]:
    res, names = out["res"], list(out["res"])
    short = res[names[0]]
    ratios = {name: {f"{m}.{st}": res[name][m][st] / short[m][st]
                     for m in ("commit_own_ms", "commit_total_ms", "construct_plus_commit_ms")
                     for st in ("p50", "mean", "p95")} for name in names[1:]}
    print()
    print(f"{n} uncontended compare_and_append commits per shard, fresh Shard(url) per commit, moto S3")
    print(f"{'':34s}" + "".join(f"{'history ' + str(res[x]['history']):>18s}" for x in names)
          + "".join(f"{'ratio ' + x:>13s}" for x in names[1:]))
    for metric, label in (("construct_ms", "handle construction (boto3)"), ("commit_own_ms", "commit, own work"),
                          ("commit_total_ms", "commit incl. rollup maintenance"),
                          ("construct_plus_commit_ms", "construction + commit")):
        for st in ("p50", "mean", "p95"):
            print(f"{label + ' ' + st:34s}" + "".join(f"{res[x][metric][st]:15.1f} ms" for x in names)
                  + "".join(f"{res[x][metric][st] / short[metric][st]:13.2f}" for x in names[1:]))
    for name in names:
        r = res[name]
        cut = f" CUT SHORT after {r['commits']} commits" if r["cut_short_at"] else ""
        print(f"requests/commit [{name}]: own mean {r['own_requests']['mean']:.2f} (min {r['own_requests']['min']}, "
              f"max {r['own_requests']['max']}); {r['rollups']} rollups costing {r['rollup_requests_each']} requests, "
              f"{', '.join(f'{x:.0f}' for x in r['rollup_ms_each'])} ms; amortized incl. rollup "
              f"{r['requests_per_commit_incl_rollup']:.2f}{cut}")
        print(f"  object sizes [{name}]: LATEST.json {r['latest_hint_bytes']:,} B, newest rollup "
              f"(seqno {r['newest_rollup']['seqno']}) {r['newest_rollup']['bytes']:,} B; typical commit "
              f"({r['typical_commit_share']:.0%}): {r['typical_commit_requests']}")
    if out["profile"] is not None:
        p = out["profile"]
        print(f"profile of {p['commits']} more commits on {p['shard']} ({p['wall_s']:.1f}s; one writes a rollup), "
              "top by cumulative time:")
        print(p["top_cumulative"])
    verdicts = {}
    print()
    for name in names[1:]:
        q = ratios[name]
        own = max(q["commit_own_ms.p50"], q["commit_own_ms.mean"])
        verdicts[f"{name}.latency_ratio_own"] = own <= TARGET_LATENCY_RATIO
        verdicts[f"{name}.latency_ratio_incl_rollup_mean"] = q["commit_total_ms.mean"] <= TARGET_LATENCY_RATIO
        print(f"VERDICT latency@{res[name]['history']}/latency@{short['history']} (own commit) p50 "
              f"{q['commit_own_ms.p50']:.2f}, mean {q['commit_own_ms.mean']:.2f} (target <= {TARGET_LATENCY_RATIO}): "
              f"{'MET' if own <= TARGET_LATENCY_RATIO else 'MISSED'}")
        print(f"VERDICT latency@{res[name]['history']}/latency@{short['history']} incl. rollup maintenance, mean "
              f"{q['commit_total_ms.mean']:.2f} (target <= {TARGET_LATENCY_RATIO}): "
              f"{'MET' if verdicts[f'{name}.latency_ratio_incl_rollup_mean'] else 'MISSED'}")
    worst = max(r["own_requests"]["max"] for r in res.values())
    verdicts["requests_per_commit_own"] = worst <= TARGET_REQUESTS
    print(f"VERDICT requests per commit (own) max {worst} (target <= {TARGET_REQUESTS}; amortized incl. rollup "
          f"{max(r['requests_per_commit_incl_rollup'] for r in res.values()):.2f}): "
          f"{'MET' if worst <= TARGET_REQUESTS else 'MISSED'}")
    return ratios, verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="history 300 instead of 2000 and 20000, 30 timed commits")
    ap.add_argument("--histories", help="comma-separated prior commits of the long shards (default 2000,20000)")
    ap.add_argument("--commits", type=int, help="timed commits per shard (default 100)")
    ap.add_argument("--max-seconds", type=float, default=900.0,
                    help="bound on each build and on each shard's timed commits (default 900)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile of 32 more commits")
    args = ap.parse_args()
    try:
        longs = [int(x) for x in args.histories.split(",")] if args.histories else ([300] if args.quick else
                                                                                     [2000, 20000])
    except ValueError:
        raise SystemExit(f"--histories must be comma-separated integers, got {args.histories!r}") from None
    n = args.commits or (30 if args.quick else 100)
    if any(h <= SHORT for h in longs) or n < 1 or args.max_seconds <= 0:
        raise SystemExit(f"--histories must each be > {SHORT} (got {longs}), --commits >= 1 (got {n}), "
                         f"--max-seconds > 0 (got {args.max_seconds})")
    started, load_start = time.perf_counter(), os.getloadavg()
    out = run([SHORT, *longs], n, args.max_seconds, not args.no_profile)
    ratios, verdicts = report(out, n)
    doc = {
        "name": "commit_cost", "quick": args.quick,
        "config": {"short_history": SHORT, "long_histories": longs, "timed_commits": n, "backend": "moto S3",
                   "max_seconds": args.max_seconds, "fresh_handle_per_commit": True,
                   "python": platform.python_version(), "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "fast_path_check": out["check"], "build_s": out["build"], "history_built": out["history"],
        "results": out["res"], "ratios_long_over_short": ratios, "profile": out["profile"],
        "targets": {"latency_ratio": TARGET_LATENCY_RATIO, "requests_per_commit": TARGET_REQUESTS},
        "verdicts": verdicts, "wall_s": time.perf_counter() - started,
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
    }
    RESULTS.mkdir(exist_ok=True)
    name = "commit_cost.json" if longs == [2000, 20000] else f"commit_cost@{'-'.join(map(str, longs))}.json"
    (RESULTS / name).write_text(json.dumps(doc, indent=2, default=str))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"wrote {RESULTS / name} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
