"""The view's upkeep on its background worker (:mod:`shardsink.iceberg.background`): the append
returns before it runs, ``flush`` brings the view current, queued commits coalesce into one
catch-up with the same view as inline mode, a failure is logged and caught up, and a process that
exits normally leaves the view current. Events are ordered by blocking the worker on an Event,
never by sleeping."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

from shardsink import iceberg
from shardsink.core.after_commit import Committed, drain
from shardsink.core.shard import Shard
from shardsink.iceberg import UPKEEP, layout
from tests.iceberg.judge import consolidated, io_props, shard_at

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
WAIT = 60.0  # an Event wait's bound: only a broken test waits this long


def rows(lo: int, n: int, *, t: int) -> pa.Table:
    return pa.table({"k": [f"k{i}" for i in range(lo, lo + n)], "v": list(range(lo, lo + n)),
                     "_time": [t] * n, "_diff": [1] * n})


class Gate:
    """Wraps the worker's upkeep: records every run on the worker, and holds it until :attr:`release`
    is set (an inline run, in the committing test's own thread, passes through)."""

    def __init__(self, run: Callable[[Committed], None]) -> None:
        self.inner = run
        self.started = threading.Event()
        self.release = threading.Event()
        self.seqnos: list[int] = []

    def __call__(self, c: Committed) -> None:
        if threading.current_thread() is threading.main_thread():  # inline (a test's setup): not held
            self.inner(c)
            return
        self.seqnos.append(c.version.seqno)
        self.started.set()
        assert self.release.wait(WAIT), "the test never released the worker"
        self.inner(c)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate(UPKEEP.run)
    monkeypatch.setattr(UPKEEP, "run", g)
    with UPKEEP.using(mode="background"):
        try:
            yield g
        finally:
            g.release.set()  # a failed test leaves no worker blocked (the block's exit flushes)


def enabled(url: str) -> Shard:
    shard = Shard.create(url, SCHEMA)
    shard.append(rows(0, 3, t=1), lower=0, upper=10)
    with UPKEEP.using(mode="inline"):
        iceberg.enable(shard)
    return shard


def reads_as_head(shard: Shard) -> None:
    """The current metadata file is the head's, and pyiceberg reads it as shardsink reads the head."""
    head = shard.reader().head()
    loc = iceberg.current_location(shard)
    assert loc == layout.location(shard.url, layout.metadata_key(head.seqno))
    got = StaticTable.from_metadata(loc, properties=io_props(shard.url)).scan().to_arrow()
    assert consolidated(got) == shard_at(shard, head)[1]


def test_the_append_returns_before_the_upkeep_runs_and_flush_brings_the_view_current(shard_url: str,
                                                                                     gate: Gate) -> None:
    shard = enabled(shard_url)
    before = shard.reader().head().seqno
    shard.append(rows(3, 2, t=12), lower=10, upper=20)  # returns with the worker held
    assert gate.started.wait(WAIT) and gate.seqnos == [before + 1]
    assert iceberg.find(shard) == before  # the view trails by the queued upkeep
    assert not iceberg.flush(timeout=0)
    gate.release.set()
    assert iceberg.flush(timeout=WAIT)
    reads_as_head(shard)


def test_queued_commits_coalesce_into_one_catch_up_with_the_same_view_as_inline(tmp_path: Path, gate: Gate) -> None:
    history = [(rows(3, 2, t=12), 10, 20), (rows(5, 1, t=25), 20, 30), (rows(6, 3, t=31), 30, 40),
               (rows(9, 1, t=45), 40, 50)]
    inline = enabled(f"file://{tmp_path}/inline")
    with UPKEEP.using(mode="inline"):
        for table, lo, up in history:
            inline.append(table, lower=lo, upper=up)
    shard = enabled(f"file://{tmp_path}/background")
    first = shard.reader().head().seqno + 1
    (table, lo, up), *rest = history
    shard.append(table, lower=lo, upper=up)
    assert gate.started.wait(WAIT)  # the worker holds the first upkeep: the next commits queue behind it
    for table, lo, up in rest:
        shard.append(table, lower=lo, upper=up)
    gate.release.set()
    assert iceberg.flush(timeout=WAIT)
    assert gate.seqnos == [first, first + len(history) - 1]  # the 3 queued behind the first: one catch-up
    reads_as_head(shard)

    def view(s: Shard) -> list[tuple[object, ...]]:
        meta = StaticTable.from_metadata(iceberg.current_location(s)).metadata
        return [(snap.snapshot_id, snap.summary.operation.value, snap.summary["shardsink.seqno"],
                 snap.summary["shardsink.upper"], snap.summary["added-records"]) for snap in meta.snapshots]

    assert view(shard) == view(inline)
    names = lambda s: sorted(p.name for p in Path(s.url.removeprefix("file://"), "iceberg", "metadata").iterdir()  # noqa: E731
                             if p.name.endswith(".metadata.json"))
    assert names(shard) == names(inline)  # a metadata file for every version, as inline


def test_a_failing_upkeep_is_logged_and_the_next_commit_catches_up(tmp_path: Path, gate: Gate,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    shard = enabled(f"file://{tmp_path}/s")
    before = shard.reader().head().seqno
    inner = gate.inner

    def fail_once(c: Committed) -> None:
        gate.inner = inner
        raise OSError("the store is unreachable")

    gate.inner = fail_once
    gate.release.set()
    with caplog.at_level(logging.WARNING, logger="shardsink.iceberg"):
        shard.append(rows(3, 2, t=12), lower=10, upper=20)
        assert iceberg.flush(timeout=WAIT)  # the error is not raised into flush, nor into the next call
    assert "Iceberg upkeep failed at seqno" in caplog.text and "unreachable" in caplog.text
    assert iceberg.find(shard) == before
    shard.append(rows(5, 1, t=25), lower=20, upper=30)
    assert iceberg.flush(timeout=WAIT)
    reads_as_head(shard)


def test_a_task_drains_the_upkeep_before_it_reports(tmp_path: Path, gate: Gate) -> None:
    """What an Airflow shard task does around its body (:func:`shardsink.provider.operators.drained`):
    the worker is held until the body's last statement, and the view is current once the block ends."""
    from shardsink.provider.operators import drained

    shard = enabled(f"file://{tmp_path}/s")
    with drained():
        shard.append(rows(3, 2, t=12), lower=10, upper=20)
        gate.release.set()  # the body's last statement: the upkeep has not run yet
    reads_as_head(shard)
    assert drain(timeout=0)


CHILD = """
import atexit, os, sys, threading
import pyarrow as pa
from shardsink.core.shard import Shard
from shardsink.iceberg import UPKEEP

assert UPKEEP.mode == "background"
done = threading.Event()  # the worker is held until the main thread's last statement
inner = UPKEEP.run
UPKEEP.run = lambda c: (done.wait(60), inner(c))
shard = Shard.open(sys.argv[1])
shard.append(pa.table({"k": ["x"], "v": [7], "_time": [12], "_diff": [1]}), lower=10, upper=20)
print(shard.reader().head().seqno, flush=True)
done.set()
if sys.argv[2] == "os-exit":  # as Airflow's forked task runner ends: atexit's functions, then os._exit
    atexit._run_exitfuncs()
    os._exit(0)
"""


@pytest.mark.parametrize("ending", ["interpreter", "os-exit"])
def test_a_process_that_exits_normally_after_an_append_leaves_the_view_current(tmp_path: Path, ending: str) -> None:
    shard = enabled(f"file://{tmp_path}/s")
    before = shard.reader().head().seqno
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), shard.url, ending], capture_output=True,
                         text=True, timeout=120, check=False, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[0]) == before + 1
    reads_as_head(shard)
