"""An orphaned write job overlapping its retry: the append commits exactly one attempt per slot.

Killing a Celery worker's process group leaves a write task's spark-submit JVM and its driver
alive (Airflow 3.3 starts each task runner in its own process group). That orphan keeps staging
parts under ``parts/<desc_id>/`` and then publishes its slot's manifest while the task's retry
stages and publishes the same description and slot, and the append may already be running.
The guarantee under test: for each slot the append commits exactly one attempt's parts, never
both; the other attempt's parts are deleted by the append's cleanup or left for GC; after GC
nothing leaks, and the shard holds every source row of the description exactly once.

Real OS processes (three workers, reused across scenarios): the orphan and the retry each run
the write job's slot step (:func:`write_attempt`), the append worker runs
``append_from_manifests``; this process mints, orders the events and checks. Events are
ordered by hooks, never by sleeps; a paused worker blocks on its queue until released:

* the orphan pauses after its first Spark task's parts: it is still staging;
* the retry pauses at the library's ``write.staged`` hook (staged, manifest not published);
* the append pauses before its k-th store request (:class:`Gate`), for every k of an
  uncontended append (on S3: the two reads that decide what it commits): the orphan finishes
  there (stages its last task's parts, publishes its manifest). Or the orphan finishes after
  the append committed and cleaned up.

The write step runs without a JVM: the same library calls as ``shardsink.spark.job.write_slot``
(``slot_facts``, the seals, the landing source's slot files read and checked as its executors
do, parts written by the same part builder under fresh keys, ``write.staged``,
``write_manifest``), with each file staged as one Spark task would. The race lives in the store
objects those calls write and read; a spark-submit would start a JVM for each of the ~50 write
attempts here, and offers no place to pause between tasks. Which executor attempt's parts a
Spark driver collects is a separate concern (``shardsink.spark.stage``).

The independent model: the rows this test wrote to the landing zone with event times in the
description's ``[lower, upper)``, checked by :func:`support.audit` (its own decoding of state and
parts), besides ``verify`` and GC.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support import SCHEMA, Row, audit

from shardsink import Shard, hooks
from shardsink.core.fate import Committed
from shardsink.core.schema import current as current_schema
from shardsink.core.state import PartMeta
from shardsink.core.updates import TIME
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.verify import verify
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description, to_builtins
from shardsink.sinks.ingest import mint_chain
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources.base import source_from_spec
from shardsink.sources.landing import LandingSource, check_late, read_landing_file, slot_of
from shardsink.spark.job import slot_facts
from shardsink.spark.request import IngestWriteRequest, decode_request, encode_request
from shardsink.storage.base import Blob, Fetched, ObjectInfo
from shardsink.storage.url import open_blob, parse_url

SLOTS = 2
KILLED = 1  # the slot whose write task was killed (its job lives on as the orphan) and retried
START = 1_704_067_200_000
SPAN = 3_600_000
FILES_PER_SLOT = 2  # the orphan pauses between its two tasks: it is still staging
TIMEOUT = 120.0


@pytest.fixture
def backend() -> str:
    """Local only: no ordering here depends on the store's protocol; an S3 round costs the
    suite CPU and covers nothing more."""
    return "local"



# --- the write job's slot step, and the append, in a worker process ---------------------------


def write_attempt(req: IngestWriteRequest, *, after_first_task: Callable[[], None]) -> list[str]:
    """The write job's slot step (:func:`shardsink.spark.job.write_slot`) without a JVM, each
    landing file staged as one Spark task; returns the keys of the parts its manifest lists."""
    d = req.desc
    shard = Shard(req.shard_url)
    head, done = slot_facts(shard, req)
    assert done is None, f"{d.desc_id} committed before its write attempt started"
    source = source_from_spec(req.source)
    assert isinstance(source, LandingSource)
    schema, schema_id = head.header.schema, current_schema(head.header).id
    mine = [f for f in source.files() if slot_of(f.key, req.slots) == req.slot]
    inputs = [{"key": f.key, "size": f.size, "modified": f.modified} for f in mine]
    sealed, blob = seals(shard, head=head), source.blob()
    parts: list[PartMeta] = []
    for i, f in enumerate(mine):  # what read_slot's and stage_dataframe's executor functions do
        t = read_landing_file(blob, f, schema, source.time_column, root=source.root, window=(d.lower, d.upper))
        check_late(t, f, lower=d.lower, seals=sealed, root=source.root)
        t = t.filter(pc.and_(pc.greater_equal(t[TIME], d.lower), pc.less(t[TIME], d.upper)))
        parts += shard.stage(t, lower=d.lower, upper=d.upper, desc_id=d.desc_id, schema=schema).parts
        if i == 0:
            after_first_task()
    hooks.fire("write.staged", shard_url=req.shard_url, slot=req.slot, attempt=d.attempt, desc_id=d.desc_id,
               parts=len(parts))
    write_manifest(shard, d, slot=req.slot, slots=req.slots, parts=parts, inputs=inputs, schema_id=schema_id)
    return [p.key for p in parts]


class Gate:
    """A shard store that calls ``pause(label)`` once, before forwarding its ``at``-th request
    (None: never), and records the requests it forwards (``"<method> <key or prefix>"``)."""

    def __init__(self, inner: Blob, *, at: int | None, pause: Callable[[str], None]) -> None:
        self.inner, self.url, self.at, self.pause = inner, inner.url, at, pause
        self.requests: list[str] = []

    def _tick(self, what: str, key: str) -> None:
        self.requests.append(f"{what} {key}")
        if len(self.requests) == self.at:
            self.pause(f"append request {self.at}: {what} {key}")

    def get(self, key: str) -> Fetched | None:
        self._tick("get", key)
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> str:
        self._tick("put", key)
        return self.inner.put(key, data)

    def create(self, key: str, data: bytes) -> str:
        self._tick("create", key)
        return self.inner.create(key, data)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        self._tick("replace", key)
        return self.inner.replace(key, data, etag=etag)

    def delete(self, key: str) -> None:
        self._tick("delete", key)
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self._tick("delete_many", ",".join(keys))
        self.inner.delete_many(keys)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._tick("list", prefix)
        return self.inner.list(prefix)

    def __getattr__(self, name: str) -> Any:  # source reads, which an append never makes
        return getattr(self.inner, name)


def _worker(env: dict[str, str], inbox: Any, outbox: Any) -> None:
    """Runs jobs from ``inbox``: ``("write", request, pauses)`` (``pauses`` among "task": after the
    first task's parts, "write.staged": at that hook) or ``("append", url, desc, gate_at)``;
    reports ``("paused", where)`` (then waits for "go"), ``("done", value)`` or ``("error", text)``."""
    os.environ.update(env)
    pauses: set[str] = set()

    def pause(where: str) -> None:
        outbox.put(("paused", where))
        got = inbox.get(timeout=TIMEOUT)
        assert got == "go", got

    def pause_at(where: str) -> Callable[..., None]:
        return lambda **_: pause(where) if where in pauses else None

    hooks.register("write.staged", pause_at("write.staged"))
    while (job := inbox.get()) is not None:
        try:
            if job[0] == "write":
                pauses.update(job[2])
                keys = write_attempt(decode_request(job[1], IngestWriteRequest), after_first_task=pause_at("task"))
                outbox.put(("done", keys))
            else:
                _, url, desc, gate_at = job
                gate = Gate(open_blob(parse_url(url)), at=gate_at, pause=pause)
                r = append_from_manifests(Shard(url, blob=cast(Blob, gate)), Description.decode(desc), SLOTS)
                outbox.put(("done", (r.status, gate.requests)))
        except Exception as e:  # reported: the test fails naming the cause
            outbox.put(("error", f"{type(e).__name__}: {e}"))
        finally:
            pauses.clear()


class Worker:
    """One spawned worker process and its two queues."""

    def __init__(self, ctx: Any, env: dict[str, str]) -> None:
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_worker, args=(env, self.inbox, self.outbox))
        self.proc.start()

    def send(self, *job: Any) -> None:
        self.inbox.put(job)

    def go(self) -> None:
        self.inbox.put("go")

    def next(self) -> tuple[str, Any]:
        tag, value = self.outbox.get(timeout=TIMEOUT)
        assert tag != "error", value
        return tag, value

    def expect(self, tag: str) -> Any:
        got, value = self.next()
        assert got == tag, f"expected {tag}, got {got}: {value}"
        return value

    def stop(self) -> None:
        self.inbox.put(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


# --- the source and its model -------------------------------------------------------------------


def land(root: Path) -> list[Row]:
    """Landing files, ``FILES_PER_SLOT`` per writer slot, each with rows inside ``[START, START +
    SPAN)`` and one at ``START + SPAN`` (outside the description); a watermark past all of them.
    Returns the model: the rows with times inside the description."""
    names = (f"day/file-{i}.parquet" for i in range(100))
    chosen: dict[int, list[str]] = {s: [] for s in range(SLOTS)}
    for name in names:
        s = slot_of(name, SLOTS)
        if len(chosen[s]) < FILES_PER_SLOT:
            chosen[s].append(name)
    blob = open_blob(str(root))
    model: list[Row] = []
    for name in sorted(n for ns in chosen.values() for n in ns):
        salt = zlib.crc32(name.encode()) % 1000
        rows = [(f"{name}:{i}", salt + i, START + (i * 997) % SPAN, 1) for i in range(5)]
        t = pa.table({"k": [r[0] for r in rows] + [f"{name}:late"], "n": [r[1] for r in rows] + [0],
                      "event_time": [r[2] for r in rows] + [START + SPAN]})
        buf = io.BytesIO()
        pq.write_table(t, buf)
        blob.put(name, buf.getvalue())
        model += rows
    blob.put("_watermark.json", b'{"watermark": %d}' % (START + 2 * SPAN))
    return model


# --- one scenario -----------------------------------------------------------------------------


@dataclass
class Workers:
    orphan: Worker
    retry: Worker
    append: Worker


@dataclass(frozen=True)
class Outcome:
    winner: str  # "orphan" | "retry": whose slot-KILLED parts the append committed
    requests: list[str]  # the store requests the append made, in order (:class:`Gate`)
    left_before_gc: int  # the losing attempt's objects still in the store after the append
    gc_deleted: int


def scenario(w: Workers, url: str, source: LandingSource, model: list[Row], *, orphan_first: bool,
             gate_at: int | None) -> Outcome:
    """One description, slot ``KILLED`` written by the orphan and its retry in the order asked;
    checks the commit, the leftovers, verify, GC and the model; returns what happened."""
    shard = Shard.create(url, SCHEMA, upper=START)
    chain = mint_chain(shard, source, interval_end=START + SPAN, max_span=None, max_chain=1, dag_id="orphans",
                       run_id=uuid.uuid4().hex[:8], attempt=1)
    assert isinstance(chain, list) and len(chain) == 1
    d = chain[0]
    assert (d.lower, d.upper) == (START, START + SPAN)

    def request(slot: int) -> str:
        return encode_request(IngestWriteRequest(shard_url=url, source=source.typed_spec(), desc=d, slot=slot,
                                                 slots=SLOTS))

    w.retry.send("write", request(1 - KILLED), [])  # the other slot's task: one attempt
    others = set(w.retry.expect("done"))
    w.orphan.send("write", request(KILLED), ["task"])  # the killed try's job: still staging
    assert w.orphan.expect("paused") == "task"
    if orphan_first:  # the orphan publishes its manifest first, the retry overwrites it
        w.retry.send("write", request(KILLED), ["write.staged"])
        assert w.retry.expect("paused") == "write.staged"
        w.orphan.go()
        orphan = set(w.orphan.expect("done"))
        w.retry.go()
        retry = set(w.retry.expect("done"))
        w.append.send("append", url, to_builtins(d), None)
        status, requests = w.append.expect("done")
    else:  # the retry publishes first; the orphan finishes before the append's request gate_at
        w.retry.send("write", request(KILLED), [])
        retry = set(w.retry.expect("done"))
        w.append.send("append", url, to_builtins(d), gate_at)
        if gate_at is None:  # after the append returned
            status, requests = w.append.expect("done")
        else:
            w.append.expect("paused")
        w.orphan.go()
        orphan = set(w.orphan.expect("done"))
        if gate_at is not None:
            w.append.go()
            status, requests = w.append.expect("done")
    assert status == "committed"
    assert orphan and retry and others and not orphan & retry

    blob = open_blob(parse_url(url))
    fate = Shard(url).fate(d.desc_id, d.lower)
    assert isinstance(fate, Committed)
    committed = set(fate.keys)
    mine = committed - others
    assert others <= committed and mine in (orphan, retry), (
        f"slot {KILLED} committed {sorted(mine)}: orphan staged {sorted(orphan)}, retry {sorted(retry)}")
    winner, loser = ("orphan", retry) if mine == orphan else ("retry", orphan)
    left = {o.key for o in blob.list("parts/")} - committed
    assert left <= loser, f"objects neither attempt of slot {KILLED} lost: {sorted(left - loser)}"
    manifests = [o.key for o in blob.list("staging/")]
    assert verify(Shard(url)).ok

    gc = collect(Shard(url), GcOptions(retention=None, clock=lambda: time.time() + 7200))  # past the grace
    report = verify(Shard(url))
    assert report.ok and report.leaks == (), report.leaks
    assert {o.key for o in blob.list("parts/")} == committed and not list(blob.list("staging/"))
    assert (gc.parts_deleted, gc.manifests_deleted) == (len(left), len(manifests))
    audit(blob, {d.desc_id: model}, url=url)  # exactly once: the data equals the source's rows
    # A retry of the append task afterwards changes nothing.
    assert append_from_manifests(Shard(url), d, SLOTS).status == "already_committed"
    assert Shard(url).fate(d.desc_id, d.lower) == fate
    return Outcome(winner, requests, len(left) + len(manifests), gc.parts_deleted + gc.manifests_deleted)


def test_an_orphaned_write_job_overlapping_its_retry_commits_exactly_one_attempt_per_slot(
    backend: str, shard_url: str, tmp_path: Path
) -> None:
    """Every order of the orphan's manifest publish against its retry and the append: the orphan
    first; the retry first, then the orphan before each request the append makes (reading the
    manifests, listing the parts, committing, cleaning up), or after the append returned.

    On S3 only the orphan after the append, and before each of the two reads that decide what the
    append commits (the killed slot's manifest, the listing of the parts): every interleaving is
    swept on the local folder and none depends on the store, while an S3 scenario costs about 2 s
    of CPU (moto serves each of its ~150 requests over HTTP) and a local one 0.1 s."""
    source = LandingSource(str(tmp_path / "landing"))
    model = land(tmp_path / "landing")
    # Workers forked by a forkserver that imported this module once (and pandas, which pyarrow
    # imports on first use): spawned workers would each import shardsink, pyarrow, pandas and
    # boto3 again, about 1 s of CPU each.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "pandas", "boto3"])
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    w = Workers(Worker(ctx, env), Worker(ctx, env), Worker(ctx, env))

    def run(label: str, *, orphan_first: bool = False, gate_at: int | None = None) -> Outcome:
        return scenario(w, f"{shard_url}-{label}", source, model, orphan_first=orphan_first, gate_at=gate_at)

    try:
        late = run("after-commit")  # the orphan stages and publishes after the append committed and cleaned up
        assert late.winner == "retry" and late.left_before_gc > 0 and late.gc_deleted == late.left_before_gc
        requests = late.requests
        assert len(requests) >= 6
        # The append's requests that decide what it commits: its read of the killed slot's
        # manifest and its (first) listing of the description's parts.
        read_at = next(k for k, r in enumerate(requests, 1) if r.startswith("get staging/")
                       and r.endswith(f"/slot-{KILLED}.json"))
        list_at = next(k for k, r in enumerate(requests, 1) if r.startswith("list parts/"))
        gates = range(1, len(requests) + 1) if backend == "local" else (read_at, list_at)
        swept = {k: run(f"k{k}", gate_at=k) for k in gates}
        # Published before the append read the killed slot's manifest: the orphan's parts commit;
        # after it: the retry's (the orphan's parts are deleted by the append's cleanup or by GC).
        outcomes = {k: (requests[k - 1], o.winner) for k, o in swept.items()}
        assert all(o.winner == ("orphan" if k <= read_at else "retry") for k, o in swept.items()), outcomes
        if backend == "local":
            first = run("orphan-first", orphan_first=True)
            assert first.winner == "retry" and first.left_before_gc == 0  # the append's cleanup took the orphan's
    finally:
        for worker in (w.orphan, w.retry, w.append):
            worker.stop()
