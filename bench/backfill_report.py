"""bench/backfill.py's reading of a backfill and its report: per run, the mint's, writes' and
committing append's spans from Airflow's task-instance records; the critical path; the table
(one row per arm and engine) and the FIGURE lines (one per engine)."""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
CORES = os.cpu_count() or 1
DELAY_S = 2.0
#: wall(10) / wall(1) targets per engine and arm (issue 34: spark-submit; issue 45: Connect, on 2 cores)
TARGETS = {"submit": {"cpu": 0.6, "io": 0.3}, "connect": {"cpu": 0.8, "io": 0.3}}
APPEND_TARGET_S = 2.0


def _ts(value: str | None) -> float | None:
    return None if not value else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def timeline(tis: list[dict[str, Any]], runs: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """Per run in day order: the mint's, writes' and committing append's start and end (s after t0)."""
    out = []
    for r in sorted(runs, key=lambda r: r["logical_date"]):
        mine = [ti for ti in tis if ti["dag_run_id"] == r["dag_run_id"] and ti["start_date"] and ti["end_date"]
                and ti["state"] != "skipped"]  # a green run skips its later attempts' tasks

        def span(suffix: str, *, ok: bool = False, mine: list[dict[str, Any]] = mine) -> list[float]:
            got = [ti for ti in mine if ti["task_id"].endswith(suffix) and (not ok or ti["state"] == "success")]
            if not got:
                return [float("nan"), float("nan")]
            return [min(_ts(ti["start_date"]) or 0 for ti in got) - t0,
                    max(_ts(ti["end_date"]) or 0 for ti in got) - t0]

        out.append({"day": r["logical_date"][:10], "mint": span(".mint"), "write": span(".write"),
                    "append": span(".append", ok=True), "end": (_ts(r["end_date"]) or t0) - t0})
    return out


def critical_path(tl: list[dict[str, Any]]) -> str:
    """Walk back from the last commit: a day's append waited for its own writes or for the day before's."""
    chain, i = [], len(tl) - 1
    while i >= 0:
        d = tl[i]
        chain.append(f"{d['day']} append {d['append'][0]:.0f}-{d['append'][1]:.0f}s")
        if i == 0 or d["write"][1] >= tl[i - 1]["append"][1]:
            chain.append(f"{d['day']} writes {d['write'][0]:.0f}-{d['write'][1]:.0f}s")
            chain.append(f"{d['day']} mint {d['mint'][0]:.0f}-{d['mint'][1]:.0f}s")
            break
        i -= 1
    return " <- ".join(chain)


def _row(engine: str, arm: str, par: dict[str, Any], seq: dict[str, Any], *, days: int, files: int,
         rows: int) -> list[str]:
    ratio = par["wall_s"] / seq["wall_s"]
    worst = max(par["per_interval_s"], seq["per_interval_s"])
    return [
        f"| {arm}-bound, {engine} engine, {days} intervals x {files} files x {rows} rows | wall(10)/wall(1) "
        f"**{ratio:.2f}** (target <= {TARGETS[engine][arm]}; {par['wall_s']:.0f} s vs {seq['wall_s']:.0f} s) | "
        f"CPU {par['cpu_s']:.0f} s vs {seq['cpu_s']:.0f} s (CPU over the cores: {par['cpu_s'] / CORES:.0f} s = "
        f"{par['cpu_s'] / CORES / seq['wall_s']:.2f} x wall(1)) | floor at 10 (first write at "
        f"{par['first_write_s']:.0f} s + {par['cpu_after_first_write_s']:.0f} CPU-s after it over {CORES} cores): "
        f"{par['floor_s']:.0f} s = **{par['floor_s'] / seq['wall_s']:.2f}** x wall(1); cores "
        f"{par['busy_share_writing']:.0%} busy while writing | appends after the last write "
        f"{par['appends_after_last_write_s']:.1f} s for {par['appends_after_last_write']} intervals / "
        f"{seq['appends_after_last_write_s']:.1f} s for {seq['appends_after_last_write']} "
        f"(worst {worst:.2f} s per interval, target <= {APPEND_TARGET_S}) | days written before the day before "
        f"committed: {par['overlapped']} of {days - 1} | landing GETs delayed: {par['delayed_gets']} / "
        f"{seq['delayed_gets']} | load during: {'{:.1f}->{:.1f}'.format(*par['load_start_end'])} / "
        f"{'{:.1f}->{:.1f}'.format(*seq['load_start_end'])} |",
        f"| {arm}-bound, {engine} engine, critical path at 10 | {par['critical_path']} |"]


def report(results: list[dict[str, Any]], *, engines: tuple[str, ...], days: int, files: int, rows: int,
           slots: int, connect_cores: int, quick: bool, queue_to_slots: bool) -> None:
    """The table (printed; appended to bench/RESULTS.md unless ``quick``), the JSON under
    bench/results/, and one FIGURE line per engine (Connect's first)."""
    load = os.getloadavg()
    by = {(r["engine"], r["arm"], r["max_active_runs"]): r for r in results}
    lines, figures = [], []
    for engine in engines:
        for arm in ("cpu", "io"):
            lines += _row(engine, arm, by[(engine, arm, 10)], by[(engine, arm, 1)], days=days, files=files, rows=rows)
        ratios = {arm: by[(engine, arm, 10)]["wall_s"] / by[(engine, arm, 1)]["wall_s"] for arm in ("cpu", "io")}
        figures.append(f"FIGURE backfill cpu-bound {ratios['cpu']:.2f} io-bound {ratios['io']:.2f} engine {engine}")
    stamp = time.strftime("%Y-%m-%d %H:%M")
    connect = f"; Connect server local[{connect_cores}]" if "connect" in engines else ""
    queueing = "= the workers' slots" if queue_to_slots else "32 (tasks wait in the broker's order)"
    text = (f"\n## backfill{' (--quick)' if quick else ''} ({stamp}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
            f"{platform.machine()}, {CORES} cpus; engines: {', '.join(engines)}; {slots} slots per Celery worker and "
            f"Spark worker{connect}; parallelism {queueing}; io-bound: {DELAY_S:.0f} s per landing GET)\n\n"
            + "\n".join(lines) + "\n\n"
            "Exactly once against the source, `shardsink verify` exit 0 and no leaked part after `shardsink gc`: "
            "checked for every backfill.\n")
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"backfill{'-quick' if quick else ''}.json").write_text(json.dumps(results, indent=2))
    if not quick:  # a development run's figures stay out of the history
        with (BENCH / "RESULTS.md").open("a") as fh:
            fh.write(text)
    for line in figures:
        print(line)
