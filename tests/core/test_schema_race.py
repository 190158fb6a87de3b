"""Schema changes racing: appends staged under the old schema (OS processes, issue 19 §1), and
two evolvers racing to a target (threads ordered by a store hook, local folder and S3).

Writer processes loop: read the upper, stage one row under the shard's FIRST schema (schema
id 0, explicitly, whatever is current), commit ``[upper, upper + 1)``, and on a lost race
discard and try again from the new upper. An evolver process commits three schema changes
(widen, rename, add) through the same conditional put. The test runs them in rounds over
their stdin/stdout: each round releases every writer for one append at once, and in rounds
1, 3 and 5 the evolver's next change too (it races that round's appends; the later rounds'
appends come after it). Nothing may be lost: every row each writer was told committed reads back, exactly
once, under the newest schema; every appended batch records schema id 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.clock import await_line, release

from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.core.transitions import SchemaConflict, Unchanged
from shardsink.storage.base import Blob
from shardsink.storage.url import open_blob, parse_url

WORKERS = 3
APPENDS = 6

WRITER = r'''
import json, sys, uuid
import pyarrow as pa
from shardsink.core.shard import Shard
from shardsink.errors import UpperMismatchError
url, wid, k, record = sys.argv[1:5]
s = Shard.open(url)
first = s.schema_history()[0]
from shardsink.core.schema import entry_schema
schema0 = entry_schema(first)
done = []
print("ready", flush=True)
for i in range(int(k)):
    sys.stdin.readline()  # the round starts
    key = int(wid) * 1000 + i
    while True:
        upper = s.reader().head().header.upper
        t = pa.table({"k": pa.array([key], pa.int32()), "v": [f"w{wid}-{i}"], "_time": [upper], "_diff": [1]})
        d = uuid.uuid4().hex
        staged = s.stage(t, lower=upper, upper=upper + 1, desc_id=d, schema=schema0)
        assert staged.schema_id == 0, staged.schema_id
        try:
            s.compare_and_append([staged], expected_upper=upper, new_upper=upper + 1, desc_id=d)
        except UpperMismatchError:
            s.discard([staged])
            continue
        done.append(key)
        break
    print("committed", flush=True)
open(record, "w").write(json.dumps(done))
'''

EVOLVER = r'''
import sys
from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
url = sys.argv[1]
s = Shard.open(url)
print("ready", flush=True)
for c in (SchemaChange(kind="widen", name="k", type="int64"), SchemaChange(kind="rename", name="v", new_name="w"),
          SchemaChange(kind="add", name="x", type="double")):
    sys.stdin.readline()  # its round starts
    s.evolve(c)
    print("evolved", flush=True)
'''


def test_a_schema_change_racing_appends_staged_under_the_old_schema_loses_nothing(tmp_path: Path) -> None:
    url = (tmp_path / "s").as_uri()
    Shard.create(url, pa.schema([pa.field("k", pa.int32(), False), pa.field("v", pa.string())]))
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "evolver.py").write_text(EVOLVER)
    writers = [subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), url, str(w), str(APPENDS),
                                 str(tmp_path / f"rec{w}.json")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for w in range(WORKERS)]
    evolver = subprocess.Popen([sys.executable, str(tmp_path / "evolver.py"), url], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    for p in (*writers, evolver):
        await_line(p, "ready")
    for r in range(APPENDS):
        for p in (*writers, evolver) if r % 2 else writers:
            release(p)
        for p in writers:
            await_line(p, "committed")
        if r % 2:
            await_line(evolver, "evolved")
    for p in (*writers, evolver):
        assert p.wait(timeout=240) == 0
    committed = sorted(k for w in range(WORKERS) for k in json.loads((tmp_path / f"rec{w}.json").read_text()))
    assert len(committed) == WORKERS * APPENDS
    s = Shard.open(url)
    assert [e.id for e in s.schema_history()] == [0, 1, 2, 3]
    assert {b.schema_id for b in s.batches()} == {0}
    snap = s.snapshot().sort_by("k")
    assert snap.schema == pa.schema([("k", pa.int64(), False), ("w", pa.string()), ("x", pa.float64()),
                                     pa.field("_count", pa.int64())])
    assert snap.column("k").to_pylist() == committed
    assert snap.column("w").to_pylist() == [f"w{k // 1000}-{k % 1000}" for k in committed]
    assert snap.column("x").null_count == len(committed) and set(snap.column("_count").to_pylist()) == {1}
    log = s.log(limit=100)
    kinds = [c.kind for _, c in log]
    assert kinds.count("schema") == 3 and kinds.count("append") == len(committed)
    first_change = min(q for q, c in log if c.kind == "schema")
    assert any(q > first_change for q, c in log if c.kind == "append"), "no append staged under schema 0 raced a change"


class _PausedCreate:
    """The hook that orders the race: at its first create of a state version (the evolver has
    applied its rule and is about to commit) it sets ``at_create`` and waits for ``go``."""

    def __init__(self, inner: Blob, at_create: threading.Event, go: threading.Event) -> None:
        self.inner, self.url, self.at_create, self.go = inner, inner.url, at_create, go
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, data: bytes) -> str:
        if key.startswith("state/v/") and not self.fired:
            self.fired = True
            self.at_create.set()
            assert self.go.wait(60), "the rival never committed"
        return self.inner.create(key, data)


@pytest.mark.parametrize("rival", ["string", "int64"])
def test_two_evolvers_racing_to_a_target_make_one_commit_or_a_typed_refusal(shard_url: str, rival: str) -> None:
    """Evolver A plans ``add country:string`` on version 0 and is held at its create; B commits
    its own target meanwhile. A's create loses, and the one commit loop re-applies its command
    on B's version: the same target is Unchanged (both succeed, one schema commit); a target
    that made ``country`` an int64 is the typed refusal SchemaConflict, nothing written."""
    base = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
    Shard.create(shard_url, base)
    at_create, go = threading.Event(), threading.Event()
    slow = Shard(shard_url, blob=_PausedCreate(open_blob(parse_url(shard_url)), at_create, go))
    got: list[object] = []

    def evolve() -> None:
        try:
            got.append(slow.evolve_to(base.append(pa.field("country", pa.string())), writer="a"))
        except BaseException as e:  # reported by the assertion below
            got.append(e)

    t = threading.Thread(target=evolve)
    t.start()
    assert at_create.wait(60), "evolver A never reached its create"
    won = Shard(shard_url).evolve_to(base.append(pa.field("country", pa.type_for_alias(rival))), writer="b")
    go.set()
    t.join(60)
    assert isinstance(won, Version) and won.seqno == 1
    s = Shard.open(shard_url)
    assert [(q, c.writer, getattr(c, "change", None)) for q, c in s.log(limit=5)] == [
        (1, "b", f"add country:{rival}"), (0, s.log()[-1][1].writer, None)]
    if rival == "string":
        assert got == [Unchanged("schema 1 already holds the target", schema_id=1)]
    else:
        assert got == [SchemaConflict(1, "country", "needs column 'country' as string, but the shard's is int64")]
    assert [e.id for e in s.schema_history()] == [0, 1]
