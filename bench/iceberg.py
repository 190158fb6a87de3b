"""The Iceberg view's cost, on a real (moto) S3 endpoint, in one run.

1. **Upkeep of an uncontended append**: requests the upkeep sends (counted by the store's request
   counter: keys under ``iceberg/``) and the after-commit hook's share of the append's wall time
   (the time the append call spends in it), appends from one long-lived process (the previous
   view in memory; a fresh process reads it first: reported as "cold"). Two arms in the same run:
   ``background`` (the default: the hook queues the upkeep for the process's worker and the append
   returns; each append is followed by ``iceberg.flush()``, timed from the append's start, so
   appends stay uncontended) and ``inline`` (the upkeep in the append call: the baseline).
   Targets: <= 3 requests, <= 25% of the append's wall time.
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
from typing import Any

import _path  # noqa: F401  (repo root on sys.path: shardsink_dev)
import pyarrow as pa
from _moto import recorded

from shardsink import Shard, iceberg
from shardsink.core import after_commit
from shardsink.iceberg import UPKEEP, Mode, keeper, layout
from shardsink.maintenance.compact import compact
from shardsink.maintenance.since import advance_since, set_retention
from shardsink_dev.testing import moto_server

BUCKET = "iceberg-bench"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def rows(n: int, t: int) -> pa.Table:
    return pa.table({"k": [f"k{t}-{i}" for i in range(n)], "v": list(range(n)), "_time": [t] * n, "_diff": [1] * n})


class Timed:
    """A function, timed (seconds of its last call)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.last = fn, 0.0

    def __call__(self, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.last = time.perf_counter() - t


def build(url: str, commits: int, every: int) -> Shard:
    shard = Shard.create(url, SCHEMA)
    set_retention(shard, 100)  # 10 commits of 10 ms each
    iceberg.enable(shard)
    for i in range(commits):
        shard.append(rows(1, 10 * i), lower=10 * i, upper=10 * i + 10)
        if (i + 1) % every == 0:
            advance_since(shard)
            compact(shard)
            if (i + 1) % (every * 10) == 0:
                print(f"  {url}: {i + 1} commits", flush=True)
    return shard


def appends(endpoint: str, shard: Shard, n: int, timed: dict[str, Timed], *, mode: Mode = "inline",
            cold: bool = False) -> dict[str, list[float]]:
    """``n`` appends with the upkeep in ``mode``: their wall times (the append call), the time until
    ``flush`` returned (from the append's start), the hook's time in the append call, the upkeep's
    (wherever it ran), its pure part (``advance``), its requests (what moto's recorder saw under
    ``iceberg/``, the flush included)."""
    out: dict[str, list[float]] = {"wall": [], "flushed": [], "hook": [], "upkeep": [], "advance": [],
                                   "requests": []}
    with UPKEEP.using(mode=mode):
        for _ in range(n):
            upper = shard.reader().head().header.upper
            assert upper is not None
            if cold:
                keeper.forget()

            def one(lower: int = upper) -> None:
                t = time.perf_counter()
                shard.append(rows(1, lower), lower=lower, upper=lower + 10)
                out["wall"].append(time.perf_counter() - t)
                assert iceberg.flush(timeout=120)
                out["flushed"].append(time.perf_counter() - t)

            seen = recorded(endpoint, one)
            for k in ("hook", "upkeep", "advance"):
                out[k].append(timed[k].last)
            out["requests"].append(sum(1 for r in seen if f"/{layout.TABLE}/" in r["url"]))
    return out


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
    os.environ["MOTO_RECORDER_FILEPATH"] = f"/tmp/iceberg-bench-{os.getpid()}.rec"  # moto's request recorder
    with moto_server() as server:
        server.make_bucket(BUCKET)
        os.environ.update(server.env())
        timed = {"hook": Timed(UPKEEP.submit), "upkeep": Timed(keeper.upkeep), "advance": Timed(keeper.advance)}
        after_commit._hooks[layout.OPTION] = timed["hook"]  # the registered hook (in the append call), timed
        UPKEEP.run = timed["upkeep"]  # the upkeep, inline or on the worker, timed
        keeper.advance = timed["advance"]  # type: ignore[assignment]  # its pure part, timed
        with UPKEEP.using(mode="inline"):
            short = build(f"s3://{BUCKET}/short", 10, args.every)
            long = build(f"s3://{BUCKET}/long", args.history, args.every)
        bg = appends(server.endpoint, short, args.appends, timed, mode="background")
        a = appends(server.endpoint, short, args.appends, timed)
        b = appends(server.endpoint, long, args.appends, timed)
        cold = appends(server.endpoint, short, 10, timed, cold=True)
        props = {"s3.endpoint": server.endpoint, "s3.access-key-id": "testing", "s3.secret-access-key": "testing",
                 "s3.region": "us-east-1"}
        own, ice, n = read_ratio(f"s3://{BUCKET}/read", props, 20, 50_000)
    med = statistics.median
    share = med([h / w for h, w in zip(a["hook"], a["wall"], strict=True)])
    bg_share = med([h / w for h, w in zip(bg["hook"], bg["wall"], strict=True)])
    ms = {k: med(v) * 1000 for k, v in a.items() if k != "requests"}
    ml = {k: med(v) * 1000 for k, v in b.items() if k != "requests"}
    mb = {k: med(v) * 1000 for k, v in bg.items() if k != "requests"}
    lines = [
        f"## iceberg ({datetime.now(UTC):%Y-%m-%d %H:%M}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
        f"{platform.machine()}, {os.cpu_count()} cpus; moto; {args.appends} appends per arm)",
        "",
        "| what | figure | target |",
        "|---|---|---|",
        f"| upkeep requests per uncontended append (warm: view in memory) | median {med(a['requests']):.0f}, max "
        f"{max(a['requests']):.0f} (one more, the hint, every {keeper.HINT_EVERY} commits) | <= 3 |",
        f"| upkeep requests per append from a fresh process (cold) | median {med(cold['requests']):.0f} | |",
        f"| upkeep requests per append, background (until flush) | median {med(bg['requests']):.0f}, max "
        f"{max(bg['requests']):.0f} | <= 3 |",
        f"| upkeep share of the append's wall time, background (median) | {bg_share:.1%} (the hook {mb['hook']:.2f} ms "
        f"of the append call's {mb['wall']:.1f} ms; the upkeep on the worker {mb['upkeep']:.1f} ms; flushed "
        f"{mb['flushed']:.1f} ms after the append's start); the append call vs inline's without its upkeep: "
        f"{mb['wall']:.1f} / {ms['wall'] - ms['hook']:.1f} ms ({mb['wall'] / (ms['wall'] - ms['hook']):.2f}x: the "
        "worker's overlap with the append's tail) | <= 25% |",
        f"| upkeep share of the append's wall time, inline (median; the same run's baseline) | {share:.0%} (upkeep "
        f"{ms['hook']:.1f} ms of {ms['wall']:.1f} ms; its pure part {ms['advance']:.1f} ms) | |",
        f"| metadata write (upkeep) at {args.history} prior commits / at 10 | {ml['hook'] / ms['hook']:.2f}x "
        f"({ml['hook']:.1f} / {ms['hook']:.1f} ms); pure part {ml['advance'] / ms['advance']:.2f}x "
        f"({ml['advance']:.1f} / {ms['advance']:.1f} ms); the shard's own append {ml['wall'] / ms['wall']:.2f}x "
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
