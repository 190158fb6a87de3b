"""200 small appends: delta-rs ``write_deltalake`` versus shardsink ``Shard.append``, same moto S3.

The same 200 tables of 100 rows (user_id, country, amount, event, _time) are appended
to ``s3://<bucket>/delta-table`` with ``deltalake.write_deltalake(..., mode="append")``
and to a shardsink shard with ``Shard.append`` (batch i = ``[i*1000, (i+1)*1000)``),
against one moto S3 server in a child process. Both commit with a conditional put:
deltalake 1.6.6 has no DynamoDB log store any more and creates ``_delta_log/<v>.json``
with ``If-None-Match: *`` by default (``conditional_put=etag`` is set explicitly below;
``AWS_S3_ALLOW_UNSAFE_RENAME`` is not needed); one recorded append of each shows it.

Four writers, each on its own table, take turns append by append (rotating order), so
all see the same machine load:

* delta-uri    ``write_deltalake(uri)`` per append (opens the table on every call)
* delta-reuse  ``write_deltalake(dt)`` with one ``DeltaTable`` object reused
* shard        one ``Shard`` handle calling ``append`` N times
* shard-fresh  a fresh ``Shard(url)`` per append (new boto3 client: one Airflow task each)

Pairings reported (shardsink / delta): primary = shard / delta-uri (the target,
<= 1.0), reuse = shard / delta-reuse, per-task = shard-fresh / delta-uri. Every table
is read back and must hold exactly N x 100 rows.

    python bench/delta_appends.py            # 200 appends x 100 rows
    python bench/delta_appends.py --quick    # 50 appends
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
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import deltalake
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from shardsink import Shard
from shardsink_dev.testing import moto_server

BUCKET = "shardsink-bench"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 1.0
TARGET_REQUESTS = 4  # store requests of one uncontended Shard.append: as many as a bare commit
ROWS = 100
SPAN = 1000  # ms of event time per batch
SCHEMA = pa.schema([("user_id", pa.int64()), ("country", pa.string()), ("amount", pa.float64()),
                    ("event", pa.string())])


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

    def append(self, i: int, t: pa.Table) -> None:
        if self.reuse and self.table is not None:
            write_deltalake(self.table, t, mode="append")
            return
        write_deltalake(self.uri, t, mode="append", storage_options=self.so)
        if self.reuse:
            self.table = DeltaTable(self.uri, storage_options=self.so)

    def verify(self, expected_rows: int, expected_version: int) -> dict[str, int]:
        dt = DeltaTable(self.uri, storage_options=self.so)
        rows = dt.to_pyarrow_table().num_rows
        if rows != expected_rows or dt.version() != expected_version:
            raise SystemExit(f"{self.uri}: {rows} rows at version {dt.version()}; "
                             f"expected {expected_rows} rows at version {expected_version}")
        return {"rows": rows, "version": dt.version()}


class ShardWriter:
    def __init__(self, url: str, *, fresh: bool) -> None:
        self.url, self.fresh = url, fresh
        self.handle: Shard | None = None
        self.construct_s: list[float] = []

    def append(self, i: int, t: pa.Table) -> None:
        if self.handle is None:
            self.handle = Shard.create(self.url, SCHEMA, upper=0)
        elif self.fresh:
            t0 = time.perf_counter()
            self.handle = Shard(self.url)
            self.construct_s.append(time.perf_counter() - t0)
        r = self.handle.append(t, lower=i * SPAN, upper=(i + 1) * SPAN, desc_id=f"run-{i:05d}")
        if r.status != "committed":
            raise SystemExit(f"{self.url}: append {i} was {r.status}")

    def verify(self, expected_rows: int, appends: int) -> dict[str, int]:
        shard = Shard(self.url)
        info, rows = shard.info(), shard.snapshot().num_rows
        if rows != expected_rows or info.seqno != appends:
            raise SystemExit(f"{self.url}: {rows} rows at seqno {info.seqno}; expected {expected_rows} at {appends}")
        return {"rows": rows, "seqno": info.seqno}


def run_all(writers: dict[str, Any], tables: list[pa.Table]) -> dict[str, list[float]]:
    """Append table i with every writer before moving on; rotate who goes first."""
    times: dict[str, list[float]] = {k: [] for k in writers}
    names = list(writers)
    for i, t in enumerate(tables):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            writers[name].append(i, t)
            times[name].append(time.perf_counter() - t0)
    return times


def recorded(endpoint: str, fn: Callable[[], None]) -> list[dict[str, Any]]:
    """The requests moto saw while ``fn`` ran (moto's request recorder)."""
    def call(path: str, method: str = "GET") -> bytes:
        with urllib.request.urlopen(urllib.request.Request(endpoint + path, method=method), timeout=30) as r:
            return bytes(r.read())

    call("/moto-api/recorder/reset-recording", "POST")
    call("/moto-api/recorder/start-recording", "POST")
    try:
        fn()
    finally:
        call("/moto-api/recorder/stop-recording", "POST")
    lines = call("/moto-api/recorder/download-recording").decode().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def describe(reqs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    conditional = []
    for r in reqs:
        path = r["url"].split(f"/{BUCKET}", 1)[-1]
        what = "LIST" if "list-type" in path else path.split("?", 1)[0].replace(f"/{prefix}/", "", 1)
        for marker in ("_delta_log/", "state/v/", "parts/", "part-"):
            if marker in what and not what.endswith(("LATEST.json", "_last_checkpoint")):
                what = what.split(marker, 1)[0] + marker + "*"
        kinds[f"{r['method']} {what}"] += 1
        h = {k.lower(): v for k, v in (r.get("headers") or {}).items()}
        if "if-none-match" in h or "if-match" in h:
            cond = ", ".join(f"{k}: {h[k]}" for k in ("if-none-match", "if-match") if k in h)
            conditional.append(f"{r['method']} {what} {cond}")
    return {"requests": len(reqs), "kinds": dict(kinds), "conditional": conditional}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 appends instead of 200")
    ap.add_argument("--appends", type=int, help="appends per table (default 200)")
    args = ap.parse_args()
    n = args.appends or (50 if args.quick else 200)
    tables = make_tables(n + 1, ROWS)  # one extra for the request census
    census_table = tables.pop()
    started = time.perf_counter()
    load_start = os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-delta-"))
    os.environ["MOTO_RECORDER_FILEPATH"] = str(scratch / "moto_recording")  # moto server's recorder file
    pairs = {
        "primary": ("shard", "delta-uri"),
        "reuse": ("shard", "delta-reuse"),
        "per_task": ("shard-fresh", "delta-uri"),
    }
    labels = {
        "delta-uri": "write_deltalake(uri) per append",
        "delta-reuse": "write_deltalake(DeltaTable) reused",
        "shard": "one Shard handle, append x N",
        "shard-fresh": "fresh Shard(url) per append",
    }
    results: dict[str, Any] = {}
    try:
        with moto_server() as server:
            server.make_bucket(BUCKET)
            os.environ.update(server.env())
            so = storage_options(server.endpoint)
            print(f"moto S3 at {server.endpoint}; deltalake {deltalake.__version__}; "
                  f"{n} appends x {ROWS} rows per table, 4 writers interleaved", flush=True)
            writers: dict[str, Any] = {
                "delta-uri": DeltaWriter(f"s3://{BUCKET}/delta-table", so, reuse=False),
                "delta-reuse": DeltaWriter(f"s3://{BUCKET}/delta-table-reuse", so, reuse=True),
                "shard": ShardWriter(f"s3://{BUCKET}/shard", fresh=False),
                "shard-fresh": ShardWriter(f"s3://{BUCKET}/shard-fresh", fresh=True),
            }
            times = run_all(writers, tables)
            checks = {k: w.verify(n * ROWS, n - 1 if k.startswith("delta") else n) for k, w in writers.items()}
            census = {}
            for k, w in writers.items():
                reqs = recorded(server.endpoint, lambda w=w: w.append(n, census_table))
                census[k] = describe(reqs, w.uri.split(f"{BUCKET}/", 1)[1] if k.startswith("delta")
                                     else w.url.split(f"{BUCKET}/", 1)[1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    per_writer = {
        k: {
            "variant": labels[k],
            "total_s": sum(v),
            "per_append_ms": {"mean": statistics.fmean(v) * 1e3, "p50": statistics.median(v) * 1e3,
                              "first_half_mean": statistics.fmean(v[: n // 2]) * 1e3,
                              "second_half_mean": statistics.fmean(v[n // 2:]) * 1e3},
            "verified": checks[k],
            "requests_for_one_more_append": census[k],
        }
        for k, v in times.items()
    }
    per_writer["shard-fresh"]["boto3_client_construction_s"] = sum(writers["shard-fresh"].construct_s)
    for key, (ours, theirs) in pairs.items():
        results[key] = {"shardsink": ours, "delta": theirs,
                        "ratio_shardsink_over_delta": per_writer[ours]["total_s"] / per_writer[theirs]["total_s"]}

    print()
    print(f"{n} appends of {ROWS} rows to moto S3, total seconds (mean ms/append; first/second half means)")
    for k, r in per_writer.items():
        m = r["per_append_ms"]
        extra = (f"; boto3 client construction {r['boto3_client_construction_s']:.2f}s of it"
                 if "boto3_client_construction_s" in r else "")
        print(f"  {k:12s} {r['total_s']:7.2f}s  ({m['mean']:6.1f} ms; {m['first_half_mean']:.1f}/"
              f"{m['second_half_mean']:.1f}){extra}  [{r['variant']}; read back {r['verified']['rows']:,} rows]")
    print("ratios shardsink/delta:")
    for key, r in results.items():
        print(f"  {key:9s} {r['shardsink']:>12s} / {r['delta']:<12s} = {r['ratio_shardsink_over_delta']:.2f}")
    for k, r in per_writer.items():
        c = r["requests_for_one_more_append"]
        print(f"requests for append #{n + 1} [{k}]: {c['requests']} -> "
              + ", ".join(f"{kind} x{cnt}" for kind, cnt in c["kinds"].items()))
        print(f"  {'':12s} conditional: {'; '.join(c['conditional']) or 'none'}")
    ratio = results["primary"]["ratio_shardsink_over_delta"]
    ok = ratio <= TARGET
    print()
    reqs = {k: per_writer[k]["requests_for_one_more_append"]["requests"] for k in ("shard", "shard-fresh")}
    print(f"VERDICT requests per uncontended Shard.append = {reqs} (target <= {TARGET_REQUESTS}): "
          f"{'MET' if max(reqs.values()) <= TARGET_REQUESTS else 'MISSED'}")
    print(f"VERDICT shardsink/delta total time (primary) = {ratio:.2f} (target <= {TARGET}): "
          f"{'MET' if ok else 'MISSED'}")

    doc = {
        "name": "delta_appends",
        "quick": args.quick,
        "config": {"appends": n, "rows_per_append": ROWS, "backend": "moto S3", "deltalake": deltalake.__version__,
                   "delta_storage_options": {k: v for k, v in storage_options("<endpoint>").items()
                                             if "SECRET" not in k},
                   "python": platform.python_version(), "pyarrow": pa.__version__, "cpus": os.cpu_count()},
        "writers": per_writer,
        "pairings": results,
        "target": TARGET,
        "verdict": ok,
        "append_requests": {k: per_writer[k]["requests_for_one_more_append"]["requests"]
                            for k in ("shard", "shard-fresh")},
        "append_requests_target": TARGET_REQUESTS,
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
