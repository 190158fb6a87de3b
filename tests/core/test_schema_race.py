"""OS processes: schema changes racing appends staged under the old schema (issue 19 §1).

Writer processes loop: read the upper, stage one row under the shard's FIRST schema (schema
id 0, explicitly, whatever is current), commit ``[upper, upper + 1)``, and on a lost race
discard and try again from the new upper. An evolver process meanwhile commits three schema
changes (widen, rename, add) through the same conditional put. All start together (a file
barrier). Nothing may be lost: every row each writer was told committed reads back, exactly
once, under the newest schema; every appended batch records schema id 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

from shardsink.core.shard import Shard

WORKERS = 3
APPENDS = 6

WRITER = r'''
import json, sys, time, uuid
import pyarrow as pa
from shardsink.core.shard import Shard
from shardsink.errors import UpperMismatchError
url, wid, k, record, go = sys.argv[1:6]
while not __import__("os").path.exists(go):
    time.sleep(0.01)
s = Shard.open(url)
first = s.schema_history()[0]
from shardsink.core.schema import entry_schema
schema0 = entry_schema(first)
done = []
for i in range(int(k)):
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
open(record, "w").write(json.dumps(done))
'''

EVOLVER = r'''
import os, sys, time
from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
url, go = sys.argv[1:3]
while not os.path.exists(go):
    time.sleep(0.01)
s = Shard.open(url)
for c in (SchemaChange(kind="widen", name="k", type="int64"), SchemaChange(kind="rename", name="v", new_name="w"),
          SchemaChange(kind="add", name="x", type="double")):
    time.sleep(0.3)
    s.evolve(c)
'''


def test_a_schema_change_racing_appends_staged_under_the_old_schema_loses_nothing(tmp_path: Path) -> None:
    url = (tmp_path / "s").as_uri()
    Shard.create(url, pa.schema([pa.field("k", pa.int32(), False), pa.field("v", pa.string())]))
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "evolver.py").write_text(EVOLVER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), url, str(w), str(APPENDS),
                               str(tmp_path / f"rec{w}.json"), str(go)]) for w in range(WORKERS)]
    procs.append(subprocess.Popen([sys.executable, str(tmp_path / "evolver.py"), url, str(go)]))
    time.sleep(1.0)
    go.write_text("go")
    for p in procs:
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
