"""Small appends: delta-rs ``write_deltalake`` versus shardsink ``Shard.append``, same moto S3.

The same N tables of 100 rows (user_id, country, amount, event, _time) are appended
to ``s3://<bucket>/delta-table`` with ``deltalake.write_deltalake(..., mode="append")``
and to a shardsink shard with ``Shard.append`` (batch i = ``[i*1000, (i+1)*1000)``),
against one moto S3 server in a child process. Both commit with a conditional put:
deltalake 1.6.6 has no DynamoDB log store any more and creates ``_delta_log/<v>.json``
with ``If-None-Match: *`` by default (``conditional_put=etag`` is set explicitly below;
``AWS_S3_ALLOW_UNSAFE_RENAME`` is not needed); one recorded append of each shows it.
delta-rs writes its default checkpoint every 100 versions (``delta.checkpointInterval``).

Four writers (arms, ``--arms`` picks some), each on its own table, take turns append by
append (rotating order), so all see the same machine load:

* delta-uri    ``write_deltalake(uri)`` per append (opens the table on every call)
* delta-reuse  ``write_deltalake(dt)`` with one ``DeltaTable`` object reused
* shard        one ``Shard`` handle calling ``append`` N times
* shard-fresh  a fresh ``Shard(url)`` per append (new boto3 client: one Airflow task each)

Pairings (shardsink / delta, total wall time): primary = shard / delta-uri (target <= 0.1),
reuse = shard / delta-reuse, per-task = shard-fresh / delta-uri; CPU seconds of this process
plus the moto server's (/proc) as info. Progress: a line every ``--progress-every`` appends.
Bounds: an arm whose own append time passes ``--max-seconds`` stops (CUT SHORT; its pairings
compare the appends both arms completed); past ``--deadline`` all arms stop. Every table is
read back. Requests of one more uncontended append: the moto recorder, and for shardsink the
public request counter of each handle (``Shard.request_counter()``; it must agree, and gives
every append's count).

    python bench/delta_appends.py --appends 2000 --profile 200   # results/delta_appends@2000.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import deltalake
import numpy as np
import pyarrow as pa
from _moto import describe, proc_cpu_s, profiled, recorded
from deltalake import DeltaTable, write_deltalake

from shardsink import Shard
from shardsink_dev.testing import moto_server

BUCKET = "shardsink-bench"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.1  # shard / delta-uri total wall time
TARGET_REQUESTS = 4  # store requests of one uncontended Shard.append: as many as a bare commit
ROWS = 100
SPAN = 1000  # ms of event time per batch
SCHEMA = pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("amount", pa.float64()), ("event", pa.utf8())])


def make_tables(count: int, rows: int) -> list[pa.Table]:
    rng = np.random.default_rng(11)
    countries = np.array(["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA"], dtype=object)
    events = np.array([f"event:{i:05d}".ljust(20, "_") for i in range(500)], dtype=object)
    out = []
    for i in range(count):
        out.append(pa.table({
            "user_id": pa.array(rng.integers(0, 10_000, rows), pa.int64()),
            "country": pa.array(countries[rng.integers(0, len(countries), rows)], pa.string()),
            "amount": pa.array(np.round(rng.gamma(2.0, 20.0, rows), 2), pa.float64()),
            "event": pa.array(events[rng.integers(0, len(events), rows)], pa.string()),
            "_time": pa.array(i * SPAN + rng.integers(0, SPAN, rows), pa.int64()),
        }))
    return out


def storage_options(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "conditional_put": "etag",  # the default in 1.6.6; commits use If-None-Match: *
    }


class DeltaWriter:
    def __init__(self, uri: str, so: dict[str, str], *, reuse: bool) -> None:
        self.uri, self.so, self.reuse = uri, so, reuse
        self.table: DeltaTable | None = None
        self.requests: list[int] = []  # not counted for delta (the census records one append)

    def append(self, i: int, t: pa.Table) -> None:
        if self.reuse and self.table is not None:
            write_deltalake(self.table, t, mode="append")
            return
        write_deltalake(self.uri, t, mode="append", storage_options=self.so)
        if self.reuse:
            self.table = DeltaTable(self.uri, storage_options=self.so)

    def verify(self, expected_rows: int, appends: int) -> dict[str, int]:
        dt = DeltaTable(self.uri, storage_options=self.so)
        rows = dt.to_pyarrow_table().num_rows
        if rows != expected_rows or dt.version() != appends - 1:
            raise SystemExit(f"{self.uri}: {rows} rows at v{dt.version()}; expected {expected_rows} at v{appends - 1}")
        return {"rows": rows, "version": dt.version()}


class ShardWriter:
    """Appends through the public API; each handle's public request counter
    (:meth:`Shard.request_counter`) counts every request the append sends."""

    def __init__(self, url: str, *, fresh: bool) -> None:
        self.url, self.fresh = url, fresh
        self.handle: Shard | None = None
        self.construct_s: list[float] = []
        self.requests: list[int] = []  # per append (the create's requests not included)

    def _open(self) -> None:
        self.handle = Shard(self.url)

    def append(self, i: int, t: pa.Table) -> None:
        if self.handle is None:
            self.handle = Shard.create(self.url, SCHEMA, upper=0)
            self._open()
        elif self.fresh:
            t0 = time.perf_counter()
            self._open()
            self.construct_s.append(time.perf_counter() - t0)
        assert self.handle is not None
        counter = self.handle.request_counter()
        before = counter.total
        r = self.handle.append(t, lower=i * SPAN, upper=(i + 1) * SPAN, desc_id=f"run-{i:05d}")
        self.requests.append(counter.total - before)
        if r.status != "committed":
            raise SystemExit(f"{self.url}: append {i} was {r.status}")

    def verify(self, expected_rows: int, appends: int) -> dict[str, int]:
        shard = Shard(self.url)
        info, rows = shard.info(), shard.snapshot().num_rows
        if rows != expected_rows or info.seqno != appends:
            raise SystemExit(f"{self.url}: {rows} rows at seqno {info.seqno}; expected {expected_rows} at {appends}")
        return {"rows": rows, "seqno": info.seqno}


class Arm:
    """One writer's record: per-append wall, client CPU and server CPU seconds; cut when its
    own append time passes the bound."""

    def __init__(self, writer: Any, bound_s: float) -> None:
        self.writer, self.bound_s = writer, bound_s
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.server_cpu: list[float] = []
        self.cut_at: int | None = None  # appends done when the bound stopped the arm

    def step(self, i: int, t: pa.Table, server_pid: int) -> None:
        c0, s0, t0 = time.process_time(), proc_cpu_s(server_pid), time.perf_counter()
        self.writer.append(i, t)
        t1 = time.perf_counter()
        self.wall.append(t1 - t0)
        self.cpu.append(time.process_time() - c0)
        self.server_cpu.append(proc_cpu_s(server_pid) - s0)
        if self.cut_at is None and sum(self.wall) > self.bound_s:
            self.cut_at = len(self.wall)

    @property
    def running(self) -> bool:
        return self.cut_at is None


def run_all(arms: dict[str, Arm], tables: list[pa.Table], server_pid: int, every: int, started: float,
            deadline: float) -> None:
    """Append table i with every running arm before moving on; rotate who goes first.
    Prints a progress line every ``every`` appends (and when an arm is cut); past ``deadline``
    (perf_counter) every arm is cut at the same append count."""
    names = list(arms)
    for i, t in enumerate(tables):
        if time.perf_counter() > deadline:
            for a in arms.values():
                a.cut_at = a.cut_at or len(a.wall)
            print(f"  CUT SHORT: --deadline passed; every arm stops after {i} appends", flush=True)
            break
        running = [k for k in names[i % len(names):] + names[: i % len(names)] if arms[k].running]
        if not running:
            break
        for name in running:
            arms[name].step(i, t, server_pid)
            if not arms[name].running:
                print(f"  CUT SHORT: {name} passed its bound of {arms[name].bound_s:.0f}s of append time "
                      f"after {arms[name].cut_at} appends; the others go on", flush=True)
        if (i + 1) % every == 0 or i + 1 == len(tables):
            rates = "; ".join(
                f"{k} {statistics.fmean(a.wall[-every:]) * 1e3:.0f} ms/append ({len(a.wall)} done, "
                f"{len(a.wall) / sum(a.wall):.1f}/s)" for k, a in arms.items() if a.wall)
            print(f"[{time.perf_counter() - started:6.0f}s, load {os.getloadavg()[0]:.1f}] append {i + 1}/"
                  f"{len(tables)}: {rates}", flush=True)


def take_census(arms: dict[str, Arm], endpoint: str, tables: list[pa.Table]) -> dict[str, Any]:
    """The requests of one more uncontended append per arm, as moto recorded them; for the
    shard arms the store's public counter must agree."""
    census = {}
    for k, a in arms.items():
        w, done = a.writer, len(a.wall)
        reqs = recorded(endpoint, functools.partial(w.append, done, tables[done]))
        census[k] = describe(reqs, BUCKET, (w.uri if k.startswith("delta") else w.url).split(f"{BUCKET}/", 1)[1])
        if not k.startswith("delta") and w.requests[-1] != census[k]["requests"]:
            raise SystemExit(f"{k}: store counter says {w.requests[-1]} requests, moto saw {census[k]['requests']}")
    return census


LABELS = {"delta-uri": "write_deltalake(uri) per append", "delta-reuse": "write_deltalake(DeltaTable) reused",
    "shard": "one Shard handle, append x N", "shard-fresh": "fresh Shard(url) per append"}
PAIRS = {"primary": ("shard", "delta-uri"), "reuse": ("shard", "delta-reuse"), "per_task": ("shard-fresh", "delta-uri")}


def summarize(arms: dict[str, Arm], checks: dict[str, Any], census: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, a in arms.items():
        v, done = a.wall, len(a.wall)
        out[k] = {
            "variant": LABELS[k], "appends": done, "cut_short_by_bound": a.cut_at is not None, "total_s": sum(v),
            "per_append_ms": {"mean": statistics.fmean(v) * 1e3, "p50": statistics.median(v) * 1e3,
                              "first_half_mean": statistics.fmean(v[: max(1, done // 2)]) * 1e3,
                              "second_half_mean": statistics.fmean(v[done // 2:]) * 1e3},
            "cpu_per_append_ms": {"client": statistics.fmean(a.cpu) * 1e3,
                                  "moto_server": statistics.fmean(a.server_cpu) * 1e3},
            "verified": checks[k], "requests_for_one_more_append": census[k],
        }
        reqs = a.writer.requests[:done]
        if reqs:
            out[k]["requests_per_append"] = {"mean": statistics.fmean(reqs), "max": max(reqs),
                                             "typical": Counter(reqs).most_common(1)[0][0]}
    if "shard-fresh" in arms:
        out["shard-fresh"]["boto3_client_construction_s"] = sum(arms["shard-fresh"].writer.construct_s)
    return out


def pairings(arms: dict[str, Arm]) -> dict[str, Any]:
    """shardsink / delta over the appends both arms completed (all of them unless one was cut)."""
    out = {}
    for key, (ours, theirs) in PAIRS.items():
        if ours not in arms or theirs not in arms:
            continue
        a, b = arms[ours], arms[theirs]
        k = min(len(a.wall), len(b.wall))
        out[key] = {"shardsink": ours, "delta": theirs, "compared_appends": k,
                    "ratio_shardsink_over_delta": sum(a.wall[:k]) / sum(b.wall[:k]),
                    "cpu_ratio_client_plus_server": (sum(a.cpu[:k]) + sum(a.server_cpu[:k]))
                    / (sum(b.cpu[:k]) + sum(b.server_cpu[:k]))}
    return out


def report(n: int, per_writer: dict[str, Any], pairs: dict[str, Any], prof: dict[str, Any] | None) -> bool:
    print()
    print(f"{n} appends of {ROWS} rows to moto S3, total seconds (mean ms/append; first/second half means; "
          "CPU ms/append client + moto server)")
    for k, r in per_writer.items():
        m, c = r["per_append_ms"], r["cpu_per_append_ms"]
        extra = (f"; boto3 client construction {r['boto3_client_construction_s']:.2f}s of it"
                 if "boto3_client_construction_s" in r else "")
        cut = f" CUT SHORT at {r['appends']} appends by a bound" if r["cut_short_by_bound"] else ""
        print(f"  {k:12s} {r['total_s']:7.2f}s  ({m['mean']:6.1f} ms; {m['first_half_mean']:.1f}/"
              f"{m['second_half_mean']:.1f}; CPU {c['client']:.1f} + {c['moto_server']:.1f}){extra}{cut}  "
              f"[{r['variant']}; read back {r['verified']['rows']:,} rows]")
    print("ratios shardsink/delta (wall time; CPU client+server, info):")
    for key, r in pairs.items():
        over = "" if r["compared_appends"] == n else f"  (over the first {r['compared_appends']} appends only)"
        print(f"  {key:9s} {r['shardsink']:>12s} / {r['delta']:<12s} = {r['ratio_shardsink_over_delta']:.3f}"
              f"  (CPU {r['cpu_ratio_client_plus_server']:.3f}){over}")
    for k, r in per_writer.items():
        c = r["requests_for_one_more_append"]
        print(f"requests for one more append [{k}]: {c['requests']} -> "
              + ", ".join(f"{kind} x{cnt}" for kind, cnt in c["kinds"].items()))
        print(f"  {'':12s} conditional: {'; '.join(c['conditional']) or 'none'}")
        if "requests_per_append" in r:
            q = r["requests_per_append"]
            print(f"  {'':12s} store counter over all {r['appends']} appends: typical {q['typical']}, "
                  f"mean {q['mean']:.2f} (incl. the rollup every 32nd commit), max {q['max']}")
    if prof is not None:
        print(f"profile of {prof['calls']} more [shard] appends: wall {prof['wall_s']:.2f}s, client CPU "
              f"{prof['client_cpu_s']:.2f}s, moto server CPU {prof['server_cpu_s']:.2f}s; top by own time:")
        print(prof["top_tottime"])
    ratio = pairs["primary"]["ratio_shardsink_over_delta"]
    reqs = {k: per_writer[k]["requests_for_one_more_append"]["requests"] for k in ("shard", "shard-fresh")
            if k in per_writer}
    print()
    print(f"VERDICT requests per uncontended Shard.append = {reqs} (target <= {TARGET_REQUESTS}): "
          f"{'MET' if max(reqs.values()) <= TARGET_REQUESTS else 'MISSED'}")
    print(f"VERDICT shardsink/delta total time (primary, {pairs['primary']['compared_appends']} appends) = "
          f"{ratio:.3f} (target <= {TARGET}): {'MET' if ratio <= TARGET else 'MISSED'}")
    return ratio <= TARGET


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 appends instead of 200")
    ap.add_argument("--appends", type=int, help="appends per table (default 200)")
    ap.add_argument("--max-seconds", type=float, default=1500.0,
                    help="bound on each arm's own append time; an arm past it stops (default 1500)")
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="seconds after which every arm stops appending (default none)")
    ap.add_argument("--progress-every", type=int, help="a progress line every so many appends (default N/20)")
    ap.add_argument("--arms", default=",".join(LABELS), help=f"comma-separated arms (default {','.join(LABELS)})")
    ap.add_argument("--profile", type=int, default=0, help="cProfile so many more shard appends (default 0)")
    args = ap.parse_args()
    n = args.appends or (50 if args.quick else 200)
    chosen = args.arms.split(",")
    if not {"shard", "delta-uri"} <= set(chosen) <= set(LABELS):
        raise SystemExit(f"--arms must name shard and delta-uri among {list(LABELS)} (got {args.arms!r})")
    if n < 2 or args.max_seconds <= 0 or args.profile < 0:
        raise SystemExit(f"--appends must be >= 2 (got {n}), --max-seconds > 0 (got {args.max_seconds}), "
                         f"--profile >= 0 (got {args.profile})")
    every = args.progress_every or max(1, n // 20)
    tables = make_tables(n + 1 + args.profile, ROWS)  # extra ones: the census, the profile
    started = time.perf_counter()
    load_start = os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-delta-"))
    os.environ["MOTO_RECORDER_FILEPATH"] = str(scratch / "moto_recording")  # moto server's recorder file
    prof = None
    try:
        with moto_server() as server:
            server.make_bucket(BUCKET)
            os.environ.update(server.env())
            so = storage_options(server.endpoint)
            pid = server.process.pid
            print(f"moto S3 at {server.endpoint}; deltalake {deltalake.__version__}; {n} appends x {ROWS} rows "
                  f"per table, {len(chosen)} arms interleaved, each bounded to {args.max_seconds:.0f}s of append time; "
                  f"load {load_start[0]:.1f}", flush=True)
            arms = {
                "delta-uri": Arm(DeltaWriter(f"s3://{BUCKET}/delta-table", so, reuse=False), args.max_seconds),
                "delta-reuse": Arm(DeltaWriter(f"s3://{BUCKET}/delta-table-reuse", so, reuse=True), args.max_seconds),
                "shard": Arm(ShardWriter(f"s3://{BUCKET}/shard", fresh=False), args.max_seconds),
                "shard-fresh": Arm(ShardWriter(f"s3://{BUCKET}/shard-fresh", fresh=True), args.max_seconds),
            }
            arms = {k: a for k, a in arms.items() if k in chosen}
            run_all(arms, tables[:n], pid, every, started, started + args.deadline)
            print(f"[{time.perf_counter() - started:6.0f}s] reading every table back", flush=True)
            checks = {k: a.writer.verify(len(a.wall) * ROWS, len(a.wall)) for k, a in arms.items()}
            census = take_census(arms, server.endpoint, tables)
            if args.profile:
                done = len(arms["shard"].wall) + 1
                w = arms["shard"].writer
                prof = profiled(lambda j: w.append(done + j, tables[done + j]), args.profile, pid)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    per_writer = summarize(arms, checks, census)
    pairs = pairings(arms)
    ok = report(n, per_writer, pairs, prof)
    doc = {
        "name": "delta_appends",
        "quick": args.quick,
        "config": {"appends": n, "rows_per_append": ROWS, "backend": "moto S3", "deltalake": deltalake.__version__,
                   "max_seconds_per_arm": args.max_seconds,
                   "delta_storage_options": {k: v for k, v in storage_options("<endpoint>").items()
                                             if "SECRET" not in k},
                   "python": platform.python_version(), "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "writers": per_writer,
        "pairings": pairs,
        "target": TARGET,
        "verdict": ok,
        "append_requests": {k: per_writer[k]["requests_for_one_more_append"]["requests"]
                            for k in ("shard", "shard-fresh") if k in per_writer},
        "append_requests_target": TARGET_REQUESTS,
        "profile": prof,
        "wall_s": time.perf_counter() - started,
        "loadavg_1m_start_end": [load_start[0], os.getloadavg()[0]],
    }
    RESULTS.mkdir(exist_ok=True)
    name = "delta_appends.json" if n == 200 else f"delta_appends@{n}.json"  # both sizes kept for the summary
    (RESULTS / name).write_text(json.dumps(doc, indent=2))
    print(f"machine load average (1 min) at start/end: {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"wrote {RESULTS / name} ({doc['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
