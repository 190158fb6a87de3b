"""GC next to in-flight writers (real OS processes): what a writer staged or read inside the
grace period survives a GC, and its commit then lands intact (or is refused cleanly)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gc_helpers import SCHEMA, append_days, contents

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
    import json, os, sys, time
    import pyarrow as pa
    from shardsink import Shard
    url, sig = sys.argv[1], sys.argv[2]
    shard = Shard.open(url)
    lower = shard.info().upper
    n = 200_000
    table = pa.table({"k": [f"slow{i}" for i in range(n)], "_time": [lower + i % 10 for i in range(n)]})
    open(os.path.join(sig, "staging"), "w").close()
    staged = shard.stage(table, lower=lower, upper=lower + 10, desc_id="slow")
    open(os.path.join(sig, "staged"), "w").close()
    while not os.path.exists(os.path.join(sig, "go")):
        time.sleep(0.05)
    r = shard.compare_and_append([staged], expected_upper=lower, new_upper=lower + 10, desc_id="slow")
    print(json.dumps({"status": r.status, "rows": r.rows, "parts": [p.key for p in staged.parts]}))
""")

SLOW_PUT = textwrap.dedent("""
    import json, os, sys, time, uuid
    import pyarrow as pa
    from shardsink import Shard, UpperMismatchError
    from shardsink.core import transitions as tr
    from shardsink.core.commands import AppendCommand
    url, sig = sys.argv[1], sys.argv[2]
    shard = Shard.open(url)
    lower = shard.info().upper
    staged = shard.stage(pa.table({"k": ["late"], "_time": [lower]}), lower=lower, upper=lower + 10, desc_id="late")
    cmd = AppendCommand("late", lower, lower + 10, staged.parts)
    seen = []
    apply = tr.apply
    def step(h, batches, c, stamp):  # the commit loop's pure step, observed
        seen.append(h.seqno)
        if len(seen) == 1:  # read version n, then sleep through other commits and a GC before creating n+1
            open(os.path.join(sig, "read"), "w").close()
            while not os.path.exists(os.path.join(sig, "go")):
                time.sleep(0.05)
        return apply(h, batches, c, stamp)
    tr.apply = step
    out = shard.machine.commit(cmd, writer="slow-writer")
    print(json.dumps({"out": type(out).__name__, "seen": seen}))
""")


def _wait(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path.name} never signalled"
        time.sleep(0.05)


def _gc(url: str) -> str:
    r = subprocess.run([sys.executable, "-c", GC, url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_writer_sleeping_through_gc_commits_intact_data(shard_url: str, tmp_path: Path) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 12)
    before = contents(shard)
    w = subprocess.Popen([sys.executable, "-c", STAGER, shard_url, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    _wait(tmp_path / "staging", w)
    _gc(shard_url)  # while the writer stages
    _wait(tmp_path / "staged", w)
    _gc(shard_url)  # while the writer sleeps between staging and committing
    (tmp_path / "go").touch()
    out, _ = w.communicate(timeout=300)
    assert w.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "committed" and result["rows"] == 200_000
    fresh = Shard.open(shard_url)
    after = contents(fresh)
    assert len(after) == len(before) + 200_000 and set(before) <= set(after)
    assert sum(1 for k, _ in after if k.startswith("slow")) == 200_000
    assert verify(fresh).ok


def test_writer_that_read_the_head_before_a_gc_cannot_fork_the_history(shard_url: str, tmp_path: Path) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 12)
    w = subprocess.Popen([sys.executable, "-c", SLOW_PUT, shard_url, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    _wait(tmp_path / "read", w)
    read_at = Shard.open(shard_url).info().seqno
    append_days(Shard.open(shard_url), 12, 10)  # others commit n+1 .. n+10 meanwhile
    _gc(shard_url)  # aggressive retention: only the grace period protects version n+1
    (tmp_path / "go").touch()
    out, _ = w.communicate(timeout=300)
    assert w.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["out"] == "UpperMismatch" and result["seen"][0] == read_at
    fresh = Shard.open(shard_url)
    assert fresh.info().seqno == read_at + 10 and fresh.info().upper == 220
    assert "late" not in {b.desc_id for b in fresh.batches()}
    assert verify(fresh).ok
