"""Long shard histories for benchmarks, built fast: the library's own ``Shard.append`` on a
local tmpfs folder, then the objects uploaded to (moto) S3; and the check that this gives the
same state objects as real S3 appends (:func:`check_fast_path`).

Rollups older than the newest are not uploaded: no commit or read of a newer version reads
them (a 20,000-commit history holds 625 of them, 1.2 GB). Used by ``commit_cost.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardsink import Shard

BUCKET = "shardsink-bench"
WRITER = "bench-writer"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def one_row(i: int) -> pa.Table:
    return pa.table({"k": [i], "v": [f"row-{i}"], "_time": [i]},
                    schema=pa.schema([*SCHEMA, pa.field("_time", pa.int64())]))


def build_local(root: Path, commits: int, *, deadline: float, label: str) -> int:
    """Up to ``commits`` real appends through the library against a local folder shard;
    stops at ``deadline`` (perf_counter). Returns the commits made."""
    t0 = time.perf_counter()
    shard = Shard.create(root.as_uri(), SCHEMA, upper=0, writer=WRITER)
    every = max(1000, commits // 10)
    for i in range(commits):
        if time.perf_counter() > deadline:
            print(f"  CUT SHORT: building {label} stopped by --max-seconds at {i} of {commits} commits", flush=True)
            return i
        r = shard.append(one_row(i), lower=i, upper=i + 1, desc_id=f"hist-{i:06d}", writer=WRITER)
        assert r.status == "committed", r
        if (i + 1) % every == 0:
            el = time.perf_counter() - t0
            print(f"  [{label}] {i + 1}/{commits} commits on tmpfs, {el:.0f}s ({(i + 1) / el:.0f}/s)", flush=True)
    return commits


def upload(root: Path, prefix: str, client: Any) -> int:
    """Copy the objects of a local shard folder to s3://BUCKET/prefix/ (parallel PUTs), all but
    the rollups older than the newest (superseded: nothing reads them)."""
    files = [p for p in root.rglob("*")
             if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)]
    rollups = sorted(p for p in files if p.parent.name == "rollup")
    files = [p for p in files if p.parent.name != "rollup"] + rollups[-1:]

    def put(p: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(root).as_posix()}", Body=p.read_bytes())

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, files))
    return len(files)


def build_fast(prefix: str, commits: int, client: Any, scratch: Path, *, bound_s: float) -> tuple[float, int]:
    """(seconds, commits built) of a ``commits``-long history at s3://BUCKET/prefix."""
    t0 = time.perf_counter()
    root = scratch / prefix
    built = build_local(root, commits, deadline=t0 + bound_s, label=prefix)
    t1 = time.perf_counter()
    objects = upload(root, prefix, client)
    shutil.rmtree(root)
    if commits >= 1000:
        print(f"  [{prefix}] uploaded {objects:,} objects in {time.perf_counter() - t1:.0f}s", flush=True)
    return time.perf_counter() - t0, built


def build_real(url: str, commits: int) -> float:
    t0 = time.perf_counter()
    shard = Shard.create(url, SCHEMA, upper=0, writer=WRITER)
    for i in range(commits):
        shard.append(one_row(i), lower=i, upper=i + 1, desc_id=f"hist-{i:06d}", writer=WRITER)
    return time.perf_counter() - t0


_UUID = re.compile(r"[0-9a-f]{32}")


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
    t_fast = build_fast("check-fast", n, client, scratch, bound_s=float("inf"))[0]
    real, fast = normalized_state("check-real", client), normalized_state("check-fast", client)
    if real != fast:
        diff = sorted(k for k in set(real) | set(fast) if real.get(k) != fast.get(k))
        raise SystemExit(f"fast-path history differs from real commits in {diff[:5]}")
    return {"commits": n, "objects": sum(1 for k in real if k != "parts") + sum(real["parts"].values()),
            "real_s": t_real, "fast_s": t_fast, "identical": True}
