"""Appends racing compactions, in concurrent OS processes: every append commits, nothing is
lost or duplicated, refused compactions leave nothing behind.

Three appender processes (append at the upper, retry a lost race with a fresh description,
pause briefly between appends) and two compactor processes (looping ``compact`` with a
plan that merges at every chance) start together. The model is the union of the
appenders' records; :func:`support.audit` checks the shard against it (versions contiguous,
each description committed once, maintenance commits keep the upper and remove only live
batches, the data equals the model).

On S3 every process goes through the fault proxy without faults: it serialises conditional
puts, which moto does not make atomic across concurrent requests (real S3 does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SCHEMA, Row, audit
from support.faultproxy import fault_proxy

from shardsink import Shard
from shardsink.storage.base import Blob
from shardsink.storage.local import LocalBlob
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import FAKE_ENV, MotoServer

BUCKET = "shardsink-test"
APPENDERS, APPENDS, SPAN, COMPACTORS = 3, 8, 10, 2

APPENDER = r'''
"""An appender: at least K appends at whatever the upper is (more, until the test saw
compactions land), a lost race retried with a fresh id, a short pause between appends."""
import json, os, sys, time, uuid
import pyarrow as pa
from shardsink import Shard, UpperMismatchError
url, wid, k, span, record, ready, go, enough = sys.argv[1:9]
k, span = int(k), int(span)
def table_of(rows):
    cols = {"k": pa.string(), "n": pa.int64(), "_time": pa.int64(), "_diff": pa.int64()}
    return pa.table({c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(cols.items())})
shard = Shard(url)
shard.info()
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
with open(record, "a") as out:
    done = 0
    while done < k or (not os.path.exists(enough) and done < 400):  # keep racing until compactions landed
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
        time.sleep(0.05)
'''

COMPACTOR = r'''
import json, os, sys, time
from shardsink import Shard, UnknownOutcomeError
from shardsink.maintenance import CompactOptions, PlanOptions, compact
url, record, ready, go, stop = sys.argv[1:6]
shard = Shard(url)
shard.info()
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
opts = CompactOptions(plan=PlanOptions(min_rows=1), writer=f"compactor-{os.getpid()}")
with open(record, "a") as out:
    while True:
        last = os.path.exists(stop)  # one more pass after the appenders are done
        res = compact(shard, options=opts)
        for m in res.merges:
            out.write(json.dumps({"cid": m.compaction_id, "status": m.status, "seqno": m.seqno,
                                  "inputs": len(m.inputs), "deleted": m.deleted, "parts_out": m.parts_out}) + "\n")
            out.flush()
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


def test_appends_racing_compactions_in_os_processes_all_commit_and_nothing_is_lost_or_duplicated(
    target: tuple[str, Blob, dict[str, str]], tmp_path: Path
) -> None:
    url, blob, env = target
    (tmp_path / "appender.py").write_text(APPENDER)
    (tmp_path / "compactor.py").write_text(COMPACTOR)
    go, stop, enough = tmp_path / "go", tmp_path / "stop", tmp_path / "enough"
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    for w in range(APPENDERS):
        args = [url, str(w), str(APPENDS), str(SPAN), str(tmp_path / f"a{w}.jsonl"), str(tmp_path / f"a{w}.ready"),
                str(go), str(enough)]
        procs.append(("appender", subprocess.Popen([sys.executable, str(tmp_path / "appender.py"), *args], env=env,
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE),
                      tmp_path / f"a{w}.ready"))
    for c in range(COMPACTORS):
        args = [url, str(tmp_path / f"c{c}.jsonl"), str(tmp_path / f"c{c}.ready"), str(go), str(stop)]
        procs.append(("compactor", subprocess.Popen([sys.executable, str(tmp_path / "compactor.py"), *args], env=env,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE),
                      tmp_path / f"c{c}.ready"))
    try:
        deadline = time.monotonic() + 90
        while not all(r.exists() for _, _, r in procs):
            failed = [p.communicate() for _, p, _ in procs if p.poll() is not None]
            assert not failed and time.monotonic() < deadline, f"processes did not start: {failed}"
            time.sleep(0.01)
        go.touch()
        # Appenders keep going until two compactions applied (however slow the machine).
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                landed = [r for c in range(COMPACTORS) for r in _records(tmp_path / f"c{c}.jsonl")
                          if r["status"] == "applied"]
            except ValueError:  # a line being written
                landed = []
            if len(landed) >= 2:
                break
            time.sleep(0.05)
        enough.touch()
        for kind, p, _ in procs:
            if kind == "appender":
                _, err = p.communicate(timeout=240)
                assert p.returncode == 0, err.decode()[-3000:]
        stop.touch()
        for kind, p, _ in procs:
            if kind == "compactor":
                _, err = p.communicate(timeout=240)
                assert p.returncode == 0, err.decode()[-3000:]
    finally:
        for _, p, _ in procs:
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
