"""Concurrent OS processes appending to one shard: no lost update, no duplicate batch.

Each worker is a separate Python process (a script written to ``tmp_path``) that loops:
read the upper, append a batch ``[upper, upper + SPAN)`` under a fresh description id,
and on an upper mismatch try again from the new upper. It records every commit it was
told about in its own file. All workers start together (a file barrier) so their
commits genuinely race at the conditional put.

The model is the union of the records. :func:`support.audit` then checks the shard
against it: state versions ``0..n`` contiguous, each description in exactly one
version, the upper never decreasing, the data equal to the recorded batches. On top,
every object under ``parts/`` must be referenced: losers delete what they staged.

On S3 the workers go through :class:`support.faultproxy.FaultProxy` without faults,
because moto's conditional put is not atomic across concurrent requests and the proxy
serialises conditional puts (real S3 is atomic); see that module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SCHEMA, Row, audit
from support.clock import await_line, release
from support.faultproxy import FaultProxy, fault_proxy, fetch_log, program

from shardsink import Shard
from shardsink.storage.base import Blob
from shardsink.storage.local import LocalBlob
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import FAKE_ENV, MotoServer

BUCKET = "shardsink-test"
WORKERS = 4
APPENDS = 9  # 36 commits: crosses ROLLUP_EVERY (32), so reads go through a rollup too
SPAN = 10

WORKER = r'''
"""One concurrent writer: K appends at whatever the upper is, retrying lost races."""
import json
import sys
import uuid

import pyarrow as pa

from shardsink import Shard, StorageError, UnknownOutcomeError, UpperMismatchError

url, wid, k, span, record, mode = sys.argv[1:7]
k, span = int(k), int(span)
retry, chaos = mode == "retry", mode == "chaos"


def rows_for(desc_id, lower, upper, count=3):  # the same rows as support.rows_for
    return [(f"{desc_id}:{i}", i, lower + (i * 7) % (upper - lower), 1) for i in range(count)]


def table_of(rows):
    return pa.table({
        "k": pa.array([r[0] for r in rows], pa.string()),
        "n": pa.array([r[1] for r in rows], pa.int64()),
        "_time": pa.array([r[2] for r in rows], pa.int64()),
        "_diff": pa.array([r[3] for r in rows], pa.int64()),
    })


shard = Shard(url)
shard.info()  # connect and warm up before the barrier
print("ready", flush=True)
sys.stdin.readline()  # the test releases every worker at once

done, attempt, last = 0, 0, None
with open(record, "a") as out:
    def note(**event):
        out.write(json.dumps(event) + "\n")
        out.flush()

    while done < k:
        try:
            lower = shard.info().upper
        except StorageError:
            continue  # (chaos) reads failed even after the storage policy's retries
        desc = f"w{wid}-{attempt}-{uuid.uuid4().hex[:6]}"
        attempt += 1
        rows = rows_for(desc, lower, lower + span)
        while True:
            try:
                r = shard.append(table_of(rows), lower=lower, upper=lower + span, desc_id=desc, writer=f"w{wid}")
            except UpperMismatchError as e:
                note(event="mismatch", desc=desc, lower=lower, current=e.current)
                break
            except (UnknownOutcomeError, StorageError) as e:
                if not chaos:
                    raise
                # It may have landed: retry the very same description, never a new one.
                note(event="unsure", desc=desc, error=type(e).__name__)
                continue
            note(event="commit", status=r.status, desc=desc, lower=lower, upper=lower + span, seqno=r.seqno,
                 rows=rows)
            last = (desc, lower, rows)
            done += 1
            break

    if retry:
        # The acknowledgement of the last append was "lost": retry it with the same id,
        # once through append() and once through stage + compare_and_append + discard,
        # each from a fresh handle, as a restarted process would.
        desc, lower, rows = last
        r = Shard(url).append(table_of(rows), lower=lower, upper=lower + span, desc_id=desc)
        note(event="retry", how="append", status=r.status, desc=desc, seqno=r.seqno)
        again = Shard(url)
        staged = again.stage(table_of(rows), lower=lower, upper=lower + span, desc_id=desc)
        r = again.compare_and_append([staged], expected_upper=lower, new_upper=lower + span, desc_id=desc)
        deleted = again.discard([staged])
        note(event="retry", how="compare_and_append", status=r.status, desc=desc, seqno=r.seqno,
             staged=len(staged.parts), deleted=deleted)
'''


def run_workers(tmp_path: Path, url: str, env: dict[str, str], *, mode: str = "plain") -> list[dict[str, Any]]:
    """Start WORKERS processes together, wait for them, return all their records."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), url, str(w), str(APPENDS), str(SPAN),
                               str(tmp_path / f"w{w}.jsonl"), mode], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(WORKERS)]
    try:
        for p in procs:
            await_line(p, "ready")
        for p in procs:
            release(p)
        for p in procs:
            _, err = p.communicate(timeout=90)
            assert p.returncode == 0, f"worker failed ({p.returncode}):\n{err[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    records: list[dict[str, Any]] = []
    for w in range(WORKERS):
        for line in (tmp_path / f"w{w}.jsonl").read_text().splitlines():
            records.append({**json.loads(line), "worker": w})
    return records


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Blob, dict[str, str]]]:
    """(shard URL, a direct blob for the audit, the workers' environment), shard created."""
    name = f"conc-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if backend == "local":
        root = tmp_path / "shards" / name
        url = root.as_uri()
        blob: Blob = LocalBlob(root)
        Shard.create(url, SCHEMA, blob=blob)
        yield url, blob, env
        return
    moto: MotoServer = request.getfixturevalue("moto")
    url = f"s3://{BUCKET}/{name}"
    blob = S3Blob(BUCKET, name, client=make_client(endpoint_url=moto.endpoint))
    Shard.create(url, SCHEMA, blob=blob)
    with fault_proxy(moto.endpoint) as proxy:
        request.node.proxy = proxy
        yield url, blob, {**env, **FAKE_ENV, "AWS_ENDPOINT_URL": proxy.url}


def check(records: list[dict[str, Any]], blob: Blob, url: str) -> dict[str, Any]:
    """Audit the shard against the union of the workers' records; return some numbers."""
    commits = [r for r in records if r["event"] == "commit"]
    unsure = {r["desc"] for r in records if r["event"] == "unsure"}
    assert len(commits) == WORKERS * APPENDS
    for c in commits:
        # "already committed" only after an unknown outcome of that very description.
        assert c["status"] == "committed" or c["desc"] in unsure, c
    model: dict[str, list[Row]] = {c["desc"]: [tuple(r) for r in c["rows"]] for c in commits}
    assert len(model) == len(commits), "a description id was reported committed twice"
    a = audit(blob, model, url=url)
    assert a.seqno == len(commits), "exactly one state version per reported commit"
    seqnos = sorted(c["seqno"] for c in commits)
    assert seqnos == list(range(1, len(commits) + 1)), "each commit got its own seqno"
    for c in commits:
        assert a.seqno_of(c["desc"]) == c["seqno"], f"{c['desc']} reported seqno {c['seqno']}"
    uppers = [u for u in a.uppers if u is not None]
    assert uppers == sorted(uppers) and len(set(uppers)) == len(uppers), "the upper only ever grew"
    leaked_descs = {k.split("/")[1] for k in a.leaked}
    assert leaked_descs <= unsure, f"lost races left staged parts behind: {sorted(a.leaked)[:5]}"
    mismatches = [r for r in records if r["event"] == "mismatch"]
    for m in mismatches:
        assert m["desc"] not in model and m["current"] is not None and m["current"] > m["lower"]
    return {"commits": len(commits), "mismatches": len(mismatches), "unsure": len(unsure),
            "leaked_after_unknown_outcomes": len(a.leaked)}


def _race_evidence(request: pytest.FixtureRequest, stats: dict[str, Any]) -> None:
    """A test of concurrency that saw no race proves little: insist that races happened."""
    assert stats["mismatches"] > 0, f"no lost race among {WORKERS} concurrent writers: {stats}"
    proxy: FaultProxy | None = getattr(request.node, "proxy", None)
    if proxy is not None:
        refused = [r for r in proxy.requests("PUT", r"state/v/", header="If-None-Match") if r.upstream_status == 412]
        stats["refused_conditional_puts"] = len(refused)
    print(f"race evidence: {stats}")


def test_concurrent_writer_processes_commit_every_batch_exactly_once_leak_no_parts_and_retries_get_already_committed(
    target: tuple[str, Blob, dict[str, str]], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One race of WORKERS processes checks two guarantees, each asserted on its own: the race
    itself (:func:`check`: every batch committed exactly once, one version per commit, the upper
    only growing, no staged part left by a lost race; :func:`_race_evidence`: races happened), and
    the retries that follow it (each writer's last append retried through ``append`` and through
    ``stage`` + ``compare_and_append`` + ``discard``: ``already_committed`` naming the version that
    committed it, no duplicate, the retry's own staged parts discarded). The retries run after the
    race loop, so the race is the same one a plain run makes: a separate plain run (its own
    processes, moto and proxy) checked nothing more and cost 5 s (local) and 12 s (S3)."""
    url, blob, env = target
    records = run_workers(tmp_path, url, env, mode="retry")
    retries = [r for r in records if r["event"] == "retry"]
    assert len(retries) == 2 * WORKERS
    committed_at = {r["desc"]: r["seqno"] for r in records if r["event"] == "commit"}
    for r in retries:
        assert r["status"] == "already_committed", r
        assert r["seqno"] == committed_at[r["desc"]], "the retry names the version that committed it"
        if r["how"] == "compare_and_append":
            assert r["deleted"] == r["staged"], "discard deleted the retry's own staged parts, nothing else"
    stats = check(records, blob, url)  # the race: every batch exactly once, no leaked part
    _race_evidence(request, stats)


def test_concurrent_writers_under_random_s3_faults_commit_every_batch_exactly_once(
    moto: MotoServer, tmp_path: Path
) -> None:
    """Races and faults together: dropped answers, 5xx and 409 before and after the request
    applied, on every kind of request of 4 writer processes. Writers retry the same
    description after an unknown outcome and mint a fresh one after a lost race. The
    proxy is programmed over HTTP, as a separate process would."""
    name = f"conc-chaos-{uuid.uuid4().hex[:12]}"
    url = f"s3://{BUCKET}/{name}"
    blob = S3Blob(BUCKET, name, client=make_client(endpoint_url=moto.endpoint))
    Shard.create(url, SCHEMA, blob=blob)
    with fault_proxy(moto.endpoint, seed=7) as proxy:
        program(proxy.url, [
            {"kind": "drop_response_after_forward", "method": "*", "times": None, "probability": 0.03},
            {"kind": "status_before_forward", "method": "*", "status": 503, "times": None, "probability": 0.03},
            {"kind": "status_after_forward", "method": "*", "status": 500, "times": None, "probability": 0.03},
            {"kind": "status_before_forward", "method": "PUT", "status": 409, "times": None, "probability": 0.03},
        ], clear=True)
        env = {**os.environ, **FAKE_ENV, "AWS_ENDPOINT_URL": proxy.url, "PYTHONUNBUFFERED": "1"}
        records = run_workers(tmp_path, url, env, mode="chaos")
        injected = [r for r in fetch_log(proxy.url) if r["fault"]]
        proxy.clear()
    stats = check(records, blob, url)
    stats["faults_injected"] = len(injected)
    print(f"race evidence: {stats}")
    assert len(injected) >= 10, f"only {len(injected)} faults were injected"
    assert stats["mismatches"] > 0, stats
