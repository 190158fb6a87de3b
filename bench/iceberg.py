"""The Iceberg view's cost, on a real (moto) S3 endpoint, in one run.

1. **Upkeep of an uncontended append**: requests the after-commit hook sends (counted by the
   store's request counter: keys under ``iceberg/``) and its share of the append's wall time,
   appends from one long-lived process (the previous view in memory; a fresh process reads it
   first: reported as "cold"). Targets: <= 3 requests, <= 25% of the append's wall time.
2. **The metadata write at 2,000 prior commits vs 10**: the hook's wall time per append on two
   shards kept the way production keeps them (retention, since advanced and batches compacted
   every ``--every`` commits, so live batches and retained snapshots stay bounded). Target <= 1.2x.
3. **A full-table read**: pyiceberg's ``StaticTable.from_metadata(...).scan().to_arrow()`` vs
   shardsink's own ``Shard.snapshot()`` of the same shard. Target <= 1.3x.

    python bench/iceberg.py                 # 10 vs 2,000 prior commits (a few minutes)
    python bench/iceberg.py --history 300   # quick
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import pyarrow as pa

from shardsink import Shard, iceberg
from shardsink.core import after_commit
from shardsink.iceberg import keeper, layout
from shardsink.maintenance.compact import compact
from shardsink.maintenance.since import advance_since, set_retention
from shardsink.storage.retry import RetryingBlob
from shardsink.storage.url import open_blob
from shardsink_dev.testing import moto_server

BUCKET = "iceberg-bench"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def rows(n: int, t: int) -> pa.Table:
    return pa.table({"k": [f"k{t}-{i}" for i in range(n)], "v": list(range(n)), "_time": [t] * n, "_diff": [1] * n})


class Timed:
    """The registered upkeep hook, timed (seconds of its last call)."""

    def __init__(self, hook: Callable[[after_commit.Committed], None]) -> None:
        self.hook, self.last = hook, 0.0

    def __call__(self, c: after_commit.Committed) -> None:
        t = time.perf_counter()
        self.hook(c)
        self.last = time.perf_counter() - t


def build(url: str, commits: int, every: int) -> tuple[Shard, RetryingBlob]:
    blob = open_blob(url)  # its public request counter is shared by every handle on it
    shard = Shard.create(url, SCHEMA, blob=blob)
    set_retention(shard, 100)  # 10 commits of 10 ms each
    iceberg.enable(shard)
    for i in range(commits):
        shard.append(rows(1, 10 * i), lower=10 * i, upper=10 * i + 10)
        if (i + 1) % every == 0:
            advance_since(shard)
            compact(shard)
            if (i + 1) % (every * 10) == 0:
                print(f"  {url}: {i + 1} commits", flush=True)
    return shard, blob


def appends(shard: Shard, blob: RetryingBlob, n: int, timed: Timed, *,
            cold: bool = False) -> tuple[list[float], list[float], list[int]]:
    """``n`` appends: their wall times, the hook's, and the hook's requests."""
    walls, hooks, reqs = [], [], []
    for _ in range(n):
        upper = shard.reader().head().header.upper
        assert upper is not None
        if cold:
            keeper.forget()
        before = sum(v for (_, k), v in blob.requests_by_kind.items() if k.startswith(layout.TABLE))
        t = time.perf_counter()
        shard.append(rows(1, upper), lower=upper, upper=upper + 10)
        walls.append(time.perf_counter() - t)
        hooks.append(timed.last)
        reqs.append(sum(v for (_, k), v in blob.requests_by_kind.items() if k.startswith(layout.TABLE)) - before)
    return walls, hooks, reqs


def read_ratio(url: str, props: dict[str, str], batches: int, per: int) -> tuple[float, float, int]:
    from pyiceberg.table import StaticTable

    shard = Shard.create(url, SCHEMA)
    iceberg.enable(shard)
    for i in range(batches):
        shard.append(pa.table({"k": [f"k{i}-{j}" for j in range(per)], "v": list(range(per)),
                               "_time": [10 * i + j % 10 for j in range(per)], "_diff": [1] * per}),
                     lower=10 * i, upper=10 * i + 10)
    loc = iceberg.current_location(shard)
    own, ice = [], []
    for _ in range(3):
        t = time.perf_counter()
        n = shard.snapshot().num_rows
        own.append(time.perf_counter() - t)
        t = time.perf_counter()
        m = StaticTable.from_metadata(loc, properties=props).scan().to_arrow().num_rows
        ice.append(time.perf_counter() - t)
        assert n == m == batches * per, (n, m)
    return min(own), min(ice), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, default=2000)
    ap.add_argument("--every", type=int, default=50, help="since advance + compaction every N commits")
    ap.add_argument("--appends", type=int, default=30)
    args = ap.parse_args()
    load = os.getloadavg()
    with moto_server() as server:
        server.make_bucket(BUCKET)
        os.environ.update(server.env())
        timed = Timed(keeper.upkeep)
        after_commit._hooks[layout.OPTION] = timed  # the registered hook, timed
        short = build(f"s3://{BUCKET}/short", 10, args.every)
        long = build(f"s3://{BUCKET}/long", args.history, args.every)
        res = {}
        for name, (shard, blob) in (("10", short), (str(args.history), long)):
            res[name] = appends(shard, blob, args.appends, timed)
        cold = appends(*short, 10, timed, cold=True)
        props = {"s3.endpoint": server.endpoint, "s3.access-key-id": "testing", "s3.secret-access-key": "testing",
                 "s3.region": "us-east-1"}
        own, ice, n = read_ratio(f"s3://{BUCKET}/read", props, 20, 50_000)
    w10, h10, r10 = res["10"]
    wl, hl, _ = res[str(args.history)]
    med = statistics.median
    share = med([h / w for h, w in zip(h10, w10, strict=True)])
    lines = [
        f"## iceberg ({datetime.now(UTC):%Y-%m-%d %H:%M}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"{platform.machine()}, {os.cpu_count()} cpus; moto; {args.appends} appends per arm)",
        "",
        "| what | figure | target |",
        "|---|---|---|",
        f"| upkeep requests per uncontended append (warm: view in memory) | max {max(r10)}, median {med(r10)} | <= 3 |",
        f"| upkeep requests per append from a fresh process (cold) | median {med(cold[2])} | |",
        f"| upkeep share of the append's wall time (median) | {share:.0%} (upkeep {med(h10) * 1000:.1f} ms of "
        f"{med(w10) * 1000:.1f} ms) | <= 25% |",
        f"| metadata write (upkeep) at {args.history} prior commits / at 10 | {med(hl) / med(h10):.2f}x "
        f"({med(hl) * 1000:.1f} / {med(h10) * 1000:.1f} ms; append {med(wl) * 1000:.1f} / {med(w10) * 1000:.1f} ms) "
        "| <= 1.2x |",
        f"| full-table read, pyiceberg / Shard.snapshot() ({n:,} rows, 20 batches) | {ice / own:.2f}x "
        f"({ice:.2f} s / {own:.2f} s, best of 3) | <= 1.3x |",
        "",
    ]
    print("\n".join(lines))
    with RESULTS.open("a") as f:
        f.write("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
