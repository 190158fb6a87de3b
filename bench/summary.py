"""One table of every benchmark ratio against its target, from bench/results/*.json.

Each benchmark writes ``results/<name>.json`` at its default size and ``<name>@<size>.json``
at another size (e.g. 10x); every file found is a row, so both sizes show side by side, and
the last column says how the ratio moved from the default size (ratio here / ratio there).
Ratios are ours / baseline measured in the same run (throughput ratios: ours / baseline
rows per second). Rows marked "(CPU, info)" give the same ratio in CPU seconds of the
process tree: on a shared, overloaded machine they move far less than wall times. ``make bench`` prints this table last.

    python bench/summary.py [results-dir]
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Measure:
    """One row kind: which file, what is measured, how to read the figure, the target."""

    bench: str
    what: str
    get: Callable[[dict[str, Any]], float]
    size: Callable[[dict[str, Any]], int]
    target: float
    at_most: bool = True  # False: the figure must be at least the target


def _commit_ratio(arm: str, key: str, d: dict[str, Any]) -> float:
    return float(d["ratios_long_over_short"][arm][key])


def _history(arm: str, d: dict[str, Any]) -> int:
    return int(d["history_built"][arm])


MEASURES = [
    Measure("dag_overhead", "Spark staging / df.write.parquet (time)", lambda d: d["staging"]["ratio"],
            lambda d: d["staging"]["rows"], 1.2),
    Measure("dag_overhead", "Spark staging / df.write.parquet (CPU, info)", lambda d: d["staging"]["cpu_ratio"],
            lambda d: d["staging"]["rows"], 1.2),
    Measure("staging", "pyarrow staging / pq.write_table (time)", lambda d: d["ratios"]["stage_over_write_table"],
            lambda d: d["config"]["rows"], 1.3),
    Measure("staging", "pyarrow staging / pq.write_table (CPU, info)",
            lambda d: d["stage"]["cpu_median_s"]["stage"] / d["stage"]["cpu_median_s"]["write_table"],
            lambda d: d["config"]["rows"], 1.3),
    Measure("spark_read", "read_changes / spark.read.parquet (rows/s)",
            lambda d: d["ratios"]["changes_over_parquet_throughput"], lambda d: d["rows"], 0.9, at_most=False),
    Measure("spark_read", "read_changes / spark.read.parquet (CPU, info)",
            lambda d: d["cpu_ratios"]["changes_over_parquet_throughput"], lambda d: d["rows"], 0.9, at_most=False),
    Measure("spark_read", "read_snapshot / native group-by (time)",
            lambda d: d["ratios"]["snapshot_over_native_groupby"], lambda d: d["rows"], 1.2),
    Measure("spark_read", "read_snapshot / native group-by (CPU, info)",
            lambda d: d["cpu_ratios"]["snapshot_over_native_groupby"], lambda d: d["rows"], 1.2),
    Measure("correction", "correction run / full overwrite (wall)", lambda d: d["wall_ratio"], lambda d: d["rows"],
            1.0),
    Measure("correction", "correction run / full overwrite (CPU, info)", lambda d: d["cpu_ratio"],
            lambda d: d["rows"], 1.0),
    Measure("correction", "correction bytes / overwrite bytes", lambda d: d["bytes_ratio"], lambda d: d["rows"],
            0.02),
    Measure("delta_appends", "store requests per Shard.append", lambda d: max(d["append_requests"].values()),
            lambda d: d["config"]["appends"], 4),
    Measure("delta_appends", "Shard.append / write_deltalake(uri) (time)",
            lambda d: d["pairings"]["primary"]["ratio_shardsink_over_delta"],
            lambda d: d["pairings"]["primary"]["compared_appends"], 0.1),
    *(Measure("commit_cost", f"commit latency, {h:,} / 10 prior commits ({what}, mean)",
              functools.partial(_commit_ratio, f"h{h}", f"{m}.mean"), functools.partial(_history, f"h{h}"), 1.2)
      for h in (2000, 20000) for what, m in (("own", "commit_own_ms"), ("incl. rollup", "commit_total_ms"))),
]


def _load(d: dict[str, Any]) -> str:
    for key in ("loadavg_1m_start_end",):
        if key in d:
            a, b = d[key]
            return f"{a:.1f}/{b:.1f}"
    m = d.get("machine", {})
    if isinstance(m, dict) and "loadavg_start" in m:
        return f"{m['loadavg_start'][0]:.1f}/{m['loadavg_end'][0]:.1f}"
    if "load_avg" in d:
        return f"{d['load_avg'][0]:.1f}"
    return "?"


def rows(results: Path) -> list[tuple[str, str, int, float, str, str, str, str]]:
    """One row per (measure, result file); the last column is the ratio at this size over the
    ratio at the default size (how the ratio moves with size; blank for the default size)."""
    out = []
    for m in MEASURES:
        default: float | None = None
        for f in sorted(results.glob(f"{m.bench}*.json"), key=lambda p: (len(p.name), p.name)):
            if f.stem != m.bench and not f.stem.startswith(f"{m.bench}@"):
                continue
            d = json.loads(f.read_text())
            try:
                value, size = m.get(d), m.size(d)
            except (KeyError, TypeError):
                continue  # a result written by an older version of the benchmark
            ok = value <= m.target if m.at_most else value >= m.target
            target = f"{'<=' if m.at_most else '>='} {m.target:g}"
            if f.stem == m.bench:
                default, moved = value, ""
            else:
                moved = f"{value / default:.2f}x" if default else "?"
            out.append((m.what, f.name, size, value, target, "MET" if ok else "MISSED", _load(d), moved))
    return out


def main() -> int:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    table = rows(results)
    if not table:
        print(f"no benchmark results under {results}")
        return 0
    head = ("measure", "file", "size", "ratio", "target", "verdict", "load 1m start/end", "vs default size")
    widths = [max(len(str(r[i])) if i != 3 else 6 for r in [*table, head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'>' if i in (2, 3) else '<'}{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*head))
    for r in table:
        print(fmt.format(r[0], r[1], f"{r[2]:,}", f"{r[3]:.3g}", r[4], r[5], r[6], r[7]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
