"""CPU seconds of a process tree (Linux /proc): a load-independent cost for Spark jobs.

On a shared machine wall times swing with other users' load; the CPU the Spark JVM and
its Python workers spend on a job does not (much). ``tree_cpu(pid)`` sums user+system
time of ``pid`` and every descendant, including reaped children; take it before and
after a job. Returns 0.0 where /proc is unavailable. ``rounds`` times competing readers
(wall and tree CPU) in rotating order.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, int, float] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    ppid, pgid = int(fields[1]), int(fields[2])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, pgid, (utime + stime + cutime + cstime) / _TICK


def machine_jiffies() -> tuple[int, int]:
    """(all, idle + iowait) clock ticks of the machine's cores since boot (``/proc/stat``): their
    differences over a span give its core-seconds and the busy share. (0, 0) without /proc."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return sum(v), v[3] + v[4]


def machine_busy() -> float:
    """Busy core-seconds of the machine since boot (all but idle and iowait): see :func:`machine_jiffies`."""
    total, idle = machine_jiffies()
    return (total - idle) / _TICK


def tree_cpu(pid: int) -> float:
    """CPU of ``pid`` and its descendants; when ``pid`` leads its process group, also of every
    other process in that group and their descendants (a Spark JVM's Python fork server,
    shardsink/spark/forkserver.py, outlives the launcher that started it and is then reparented)."""
    if not Path("/proc").is_dir():
        return 0.0
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                stats[int(entry.name)] = got
    children: dict[int, list[int]] = {}
    for p, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(p)
    leads = pid in stats and stats[pid][1] == pid
    total, todo, seen = 0.0, [pid, *(p for p, (_, pgid, _) in stats.items() if leads and pgid == pid)], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p in stats:
            total += stats[p][2]
        todo.extend(children.get(p, []))
    return total


def spark_pid(spark: object) -> int:
    """The driver JVM's pid (local mode: every executor thread and Python worker is under it)."""
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]


def rounds(readers: dict[str, Callable[[], None]], runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each reader once to warm up, then ``runs`` rounds in rotating order; seconds and CPU seconds per run."""
    for fn in readers.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in readers}
    cpu: dict[str, list[float]] = {k: [] for k in readers}
    names = list(readers)
    for i in range(runs):
        for name in names[i % len(names):] + names[: i % len(names)]:
            c0, t0 = tree_cpu(os.getpid()), time.perf_counter()
            readers[name]()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(tree_cpu(os.getpid()) - c0)
    return times, cpu
