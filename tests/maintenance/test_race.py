"""Appends racing compactions, in concurrent OS processes: every append commits, nothing is
lost or duplicated, refused compactions leave nothing behind.

Three appender processes (append at the upper, retry a lost race with a fresh description)
and two compactor processes (looping ``compact`` with a plan that merges at every chance)
start together (each prints ``ready`` and waits on its stdin). Once an appender has made its
appends it makes one more after each compaction the test saw applied, until two applied: so
an append always follows an applied compaction, with no pause to tune. The model is the union of the
appenders' records; :func:`support.audit` checks the shard against it (versions contiguous,
each description committed once, maintenance commits keep the upper and remove only live
batches, the data equals the model).

On S3 every process goes through the fault proxy without faults: it serialises conditional
puts, which moto does not make atomic across concurrent requests (real S3 does).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SCHEMA, Row, audit
from support.clock import await_line, release
from support.faultproxy import fault_proxy

from shardsink import Shard
from shardsink.storage.base import Blob
from shardsink.storage.local import LocalBlob
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import FAKE_ENV, MotoServer

BUCKET = "shardsink-test"
APPENDERS, APPENDS, SPAN, COMPACTORS = 3, 8, 10, 2

APPENDER = r'''
"""An appender: K appends at whatever the upper is, then one more per "more" line on stdin
until "enough"; a lost race retried with a fresh id."""
import json, sys, uuid
import pyarrow as pa
from shardsink import Shard, UpperMismatchError
url, wid, k, span, record = sys.argv[1:6]
k, span = int(k), int(span)
def table_of(rows):
    cols = {"k": pa.string(), "n": pa.int64(), "_time": pa.int64(), "_diff": pa.int64()}
    return pa.table({c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(cols.items())})
shard = Shard(url)
shard.info()
print("ready", flush=True)
sys.stdin.readline()  # go
with open(record, "a") as out:
    done, want = 0, k
    while True:
        if done == want:  # one more append per "more" line, until "enough"
            if sys.stdin.readline().strip() != "more":
                break
            want += 1
        lower = shard.info().upper
        desc = f"w{wid}-{uuid.uuid4().hex[:8]}"
        rows = [(f"{desc}:{i}", i, lower + (i * 7) % span, 1) for i in range(3)]
        if done % 3 == 2:
            rows.append(("shared", 0, lower, 1))  # the same row from every writer: merges consolidate it
        try:
            r = shard.append(table_of(rows), lower=lower, upper=lower + span, desc_id=desc, writer=f"w{wid}")
        except UpperMismatchError as e:
            out.write(json.dumps({"event": "mismatch", "desc": desc, "lower": lower, "current": e.current}) + "\n")
            continue
        out.write(json.dumps({"event": "commit", "status": r.status, "desc": desc, "seqno": r.seqno,
                              "rows": rows}) + "\n")
        out.flush()
        done += 1
'''

COMPACTOR = r'''
import json, os, sys
from shardsink import Shard
from shardsink.maintenance import CompactOptions, ScheduleOptions, compact
url, record, stop = sys.argv[1:4]
shard = Shard(url)
shard.info()
print("ready", flush=True)
sys.stdin.readline()  # go
opts = CompactOptions(schedule=ScheduleOptions(min_rows=1), writer=f"compactor-{os.getpid()}")
with open(record, "a") as out:
    while True:
        last = os.path.exists(stop)  # one more pass after the appenders are done
        res = compact(shard, options=opts)
        for m in res.merges:
            out.write(json.dumps({"cid": m.compaction_id, "status": m.status, "seqno": m.seqno,
                                  "inputs": len(m.inputs), "deleted": m.deleted, "parts_out": m.parts_out}) + "\n")
            out.flush()
            if m.status == "applied":
                print("applied", flush=True)
        if last:
            break
'''


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Blob, dict[str, str]]]:
    name = f"race-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if backend == "local":
        root = tmp_path / "shards" / name
        blob: Blob = LocalBlob(root)
        Shard.create(root.as_uri(), SCHEMA, blob=blob)
        yield root.as_uri(), blob, env
        return
    moto: MotoServer = request.getfixturevalue("moto")
    blob = S3Blob(BUCKET, name, client=make_client(endpoint_url=moto.endpoint))
    Shard.create(f"s3://{BUCKET}/{name}", SCHEMA, blob=blob)
    with fault_proxy(moto.endpoint) as proxy:
        yield f"s3://{BUCKET}/{name}", blob, {**env, **FAKE_ENV, "AWS_ENDPOINT_URL": proxy.url}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _events(proc: subprocess.Popen[str], events: queue.Queue[int], c: int) -> None:
    """Put ``c`` on ``events`` for each ``applied`` line ``proc`` prints, ``-1`` when it exits."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "applied":
            events.put(c)
    events.put(-1)


def test_appends_racing_compactions_in_os_processes_all_commit_and_nothing_is_lost_or_duplicated(
    target: tuple[str, Blob, dict[str, str]], tmp_path: Path
) -> None:
    url, blob, env = target
    (tmp_path / "appender.py").write_text(APPENDER)
    (tmp_path / "compactor.py").write_text(COMPACTOR)
    stop = tmp_path / "stop"
    pipes: dict[str, Any] = {"env": env, "stdin": subprocess.PIPE, "stdout": subprocess.PIPE,
                             "stderr": subprocess.PIPE, "text": True}
    appenders = [subprocess.Popen([sys.executable, str(tmp_path / "appender.py"), url, str(w), str(APPENDS), str(SPAN),
                                   str(tmp_path / f"a{w}.jsonl")], **pipes) for w in range(APPENDERS)]
    compactors = [subprocess.Popen([sys.executable, str(tmp_path / "compactor.py"), url,
                                    str(tmp_path / f"c{c}.jsonl"), str(stop)], **pipes) for c in range(COMPACTORS)]
    applied: queue.Queue[int] = queue.Queue()
    try:
        for p in (*appenders, *compactors):
            await_line(p, "ready")
        for c, p in enumerate(compactors):  # each "applied" line becomes an event
            threading.Thread(target=_events, args=(p, applied, c), daemon=True).start()
        for p in (*appenders, *compactors):
            release(p)
        for _ in range(2):  # the appenders go on, one append per applied compaction, until two applied
            assert applied.get(timeout=300) >= 0, "a compactor exited before two compactions applied"
            for p in appenders:
                release(p, "more")
        for p in appenders:
            release(p, "enough")
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
        stop.touch()
        for p in compactors:
            assert p.wait(timeout=240) == 0, p.stderr.read()[-3000:]  # type: ignore[union-attr]
    finally:
        for p in (*appenders, *compactors):
            if p.poll() is None:
                p.kill()

    appended = [r for w in range(APPENDERS) for r in _records(tmp_path / f"a{w}.jsonl") if r["event"] == "commit"]
    assert len(appended) >= APPENDERS * APPENDS and all(r["status"] == "committed" for r in appended)
    model: dict[str, list[Row]] = {r["desc"]: [tuple(x) for x in r["rows"]] for r in appended}
    assert len(model) == len(appended)
    merges = [r for c in range(COMPACTORS) for r in _records(tmp_path / f"c{c}.jsonl")]

    a = audit(blob, model, url=url)  # nothing lost, nothing duplicated, the data equals the model
    applied = [m for m in merges if m["status"] == "applied"]
    assert applied, f"no compaction applied: {merges}"
    assert all(m["status"] in ("applied", "refused") for m in merges), merges
    append_seqnos = sorted(r["seqno"] for r in appended)
    raced = [m for m in applied if append_seqnos[0] < m["seqno"] < append_seqnos[-1]]
    assert raced, f"no compaction landed between appends: nothing raced ({merges}, appends {append_seqnos})"
    kinds = [v["commit"]["kind"] for v in a.versions]
    assert kinds.count("compact") == len(applied) and kinds.count("append") == len(appended)
    for m in merges:
        if m["status"] == "refused":
            assert list(blob.list(f"parts/{m['cid']}/")) == [], f"refused compaction {m['cid']} left its output"
        assert list(blob.list(f"staging/{m['cid']}/")) == [], f"compaction {m['cid']} left its manifest"
    compacted_away = {p["key"] for v in a.versions for b in v["added"] for p in b["parts"]} - a.referenced
    assert a.leaked <= compacted_away, f"parts nobody references or ever did: {sorted(a.leaked - compacted_away)[:5]}"
    print(f"race evidence: {len(appended)} appends, {len(applied)} compactions applied "
          f"({len(raced)} between appends), {len(merges) - len(applied)} refused, "
          f"{len(Shard(url, blob=blob).batches())} live batches")
