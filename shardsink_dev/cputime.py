"""A pytest plugin that reports where the suite's CPU goes: ``pytest -p shardsink_dev.cputime``.

``--durations`` gives wall time, which on a loaded 2-core machine mostly measures what else
ran at the same moment. This plugin measures each test's CPU: the pytest process's own user and
system time, plus that of every child process the test waited for (``airflow dags test``,
``spark-submit`` and its JVMs, helper processes), from ``getrusage``. Processes a test leaves
running (a session-scoped Spark driver, a moto server) are charged to nobody until they are
reaped, so the report names them as "unattributed".

The terminal summary lists the top tests and the CPU per test file. Nothing here changes what
a test does.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

_TOP = 40


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


class _Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float]] = []  # nodeid, self cpu, children cpu, wall
        self.start = _cpu()
        self.wall0 = time.monotonic()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        (s0, c0), w0 = _cpu(), time.monotonic()
        yield
        (s1, c1), w1 = _cpu(), time.monotonic()
        self.rows.append((item.nodeid, s1 - s0, c1 - c0, w1 - w0))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        s_end, c_end = _cpu()
        total = (s_end - self.start[0]) + (c_end - self.start[1])
        attributed = sum(r[1] + r[2] for r in self.rows)
        tr.write_sep("=", f"CPU by test (top {_TOP}; self + waited-for children)")
        for nodeid, s, c, w in sorted(self.rows, key=lambda r: -(r[1] + r[2]))[:_TOP]:
            tr.write_line(f"{s + c:8.1f}s cpu {s:7.1f} self {c:7.1f} children {w:7.1f}s wall  {nodeid}")
        by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for nodeid, s, c, w in self.rows:
            acc = by_file[nodeid.split("::")[0]]
            acc[0] += s + c
            acc[1] += w
            acc[2] += 1
        tr.write_sep("=", "CPU by test file")
        for path, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:_TOP]:
            tr.write_line(f"{cpu:8.1f}s cpu {wall:8.1f}s wall {int(n):4d} tests  {path}")
        tr.write_line(f"total {total:.1f}s cpu over {time.monotonic() - self.wall0:.1f}s wall; "
                      f"unattributed (fixtures' long-lived processes, collection) {total - attributed:.1f}s")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Recorder(), "shardsink-cputime")
