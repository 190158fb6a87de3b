"""Benchmark helpers for runs against the moto S3 server: its request recorder and its CPU.

``recorded`` returns the requests moto saw while a function ran (moto's recorder API;
the server must have been started with ``MOTO_RECORDER_FILEPATH`` set); ``describe``
groups them by kind (method and key pattern) and lists the conditional ones;
``proc_cpu_s`` is the CPU seconds of one process (the moto server) from /proc; ``profiled``
cProfiles calls of a function.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its threads included), from /proc."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


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


def describe(reqs: list[dict[str, Any]], bucket: str, prefix: str) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    conditional = []
    for r in reqs:
        path = r["url"].split(f"/{bucket}", 1)[-1]
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


def profiled(fn: Callable[[int], None], calls: int, server_pid: int) -> dict[str, Any]:
    """cProfile ``fn(0) .. fn(calls - 1)``: wall, this process's CPU, the server's CPU, top by own time."""
    prof = cProfile.Profile()
    c0, s0, t0 = time.process_time(), proc_cpu_s(server_pid), time.perf_counter()
    prof.enable()
    for j in range(calls):
        fn(j)
    prof.disable()
    wall, cpu, server = time.perf_counter() - t0, time.process_time() - c0, proc_cpu_s(server_pid) - s0
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return {"calls": calls, "wall_s": wall, "client_cpu_s": cpu, "server_cpu_s": server,
            "top_tottime": out.getvalue()}
