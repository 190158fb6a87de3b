"""GC next to in-flight writers (real OS processes): what a writer staged or read inside the
grace period survives a GC, and its commit then lands intact (or is refused cleanly)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from gc_helpers import SCHEMA, append_days, contents
from support.clock import await_line, release

from shardsink import Shard
from shardsink.maintenance.verify import verify

pytestmark = pytest.mark.usefixtures("small_windows")

GC = textwrap.dedent("""
    import sys
    from shardsink import Shard
    from shardsink.maintenance.gc import collect
    from shardsink.maintenance.gc_types import GcOptions
    r = collect(Shard.open(sys.argv[1]), GcOptions(grace_s=60, retention=1))
    print(r.versions_deleted, r.parts_deleted)
""")

STAGER = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from shardsink import Shard
    url = sys.argv[1]
    shard = Shard.open(url)
    lower = shard.info().upper
    n = 200_000
    table = pa.table({"k": [f"slow{i}" for i in range(n)], "_time": [lower + i % 10 for i in range(n)]})
    print("staging", flush=True)
    staged = shard.stage(table, lower=lower, upper=lower + 10, desc_id="slow")
    print("staged", flush=True)
    sys.stdin.readline()  # the test's go
    r = shard.compare_and_append([staged], expected_upper=lower, new_upper=lower + 10, desc_id="slow")
    print(json.dumps({"status": r.status, "rows": r.rows, "parts": [p.key for p in staged.parts]}))
""")

SLOW_PUT = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from shardsink import Shard
    from shardsink.core import transitions as tr
    from shardsink.core.commands import AppendCommand
    url = sys.argv[1]
    shard = Shard.open(url)
    lower = shard.info().upper
    staged = shard.stage(pa.table({"k": ["late"], "_time": [lower]}), lower=lower, upper=lower + 10, desc_id="late")
    cmd = AppendCommand("late", lower, lower + 10, staged.parts)
    seen = []
    apply = tr.apply
    def step(h, batches, c, stamp):  # the commit loop's pure step, observed
        seen.append(h.seqno)
        if len(seen) == 1:  # read version n, then wait through other commits and a GC before creating n+1
            print("read", flush=True)
            sys.stdin.readline()  # the test's go
        return apply(h, batches, c, stamp)
    tr.apply = step
    out = shard._machine.commit(cmd, writer="slow-writer")
    print(json.dumps({"out": type(out).__name__, "seen": seen}))
""")


def _writer(script: str, url: str) -> subprocess.Popen[str]:
    """A writer process that prints each step's name on a line and waits on stdin for the go."""
    return subprocess.Popen([sys.executable, "-c", script, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _gc(url: str) -> str:
    r = subprocess.run([sys.executable, "-c", GC, url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_writer_sleeping_through_gc_commits_intact_data(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 12)
    before = contents(shard)
    w = _writer(STAGER, shard_url)
    await_line(w, "staging")
    _gc(shard_url)  # while the writer stages
    await_line(w, "staged")
    _gc(shard_url)  # while the writer waits between staging and committing
    release(w)
    out, _ = w.communicate(timeout=300)
    assert w.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "committed" and result["rows"] == 200_000
    fresh = Shard.open(shard_url)
    after = contents(fresh)
    assert len(after) == len(before) + 200_000 and set(before) <= set(after)
    assert sum(1 for k, _ in after if k.startswith("slow")) == 200_000
    assert verify(fresh).ok


def test_writer_that_read_the_head_before_a_gc_cannot_fork_the_history(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 12)
    w = _writer(SLOW_PUT, shard_url)
    await_line(w, "read")
    read_at = Shard.open(shard_url).info().seqno
    append_days(Shard.open(shard_url), 12, 10)  # others commit n+1 .. n+10 meanwhile
    _gc(shard_url)  # aggressive retention: only the grace period protects version n+1
    release(w)
    out, _ = w.communicate(timeout=300)
    assert w.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["out"] == "UpperMismatch" and result["seen"][0] == read_at
    fresh = Shard.open(shard_url)
    assert fresh.info().seqno == read_at + 10 and fresh.info().upper == 220
    assert "late" not in {b.desc_id for b in fresh.batches()}
    assert verify(fresh).ok
