"""The Spark Connect write engine (shardsink.spark.connect): write slots as client sessions of
ONE server started per test session (tests/spark/conftest.py ``connect``).

* four concurrent Connect write slots of one description commit it exactly once, against the
  independent model (the rows this test landed inside the description; support.audit);
* a client SIGKILLed mid-write (staged, manifest not yet written) leaves the description
  StillPossible, and the retry commits exactly one attempt's parts;
* the refusals: an unreachable server, a Python version mismatch, shardsink missing on the
  server or of another version: InvalidConfigurationError naming the fix, at once;
* re-processing's correction job runs as a session too, and the corrected range reads as the
  source is now; so does a view's write job: the view reads as a from-scratch computation over
  its input, also after a retraction and a foreign append to the view;
* sessions are released: after every write (also failed ones) the server's event log holds no
  open session but the killed client's, and the process is no longer marked a Connect client
  (the later tests' classic local session starts in this same process).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import SCHEMA, Row, audit

from shardsink import Shard
from shardsink.core.fate import StillPossible
from shardsink.errors import InvalidConfigurationError, InvalidUsageError
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import mint_chain
from shardsink.sources import source_spec
from shardsink.sources.landing import LandingSource, slot_of
from shardsink.spark.connect import connect_session, redacted, run_over_connect
from shardsink.spark.request import IngestWriteRequest, encode_request
from shardsink.storage.url import open_blob, parse_url
from shardsink_dev.connect import python_env
from shardsink_dev.testing import free_port

START = 1_704_067_200_000
SPAN = 3_600_000
SLOTS = 4
ROOT = Path(__file__).resolve().parents[2]


def land(root: Path, *, slots: int, files_per_slot: int = 1, rows: int = 20) -> list[Row]:
    """Landing files (``files_per_slot`` per slot), rows inside ``[START, START + SPAN)`` and one
    row just past it (outside the description); returns the model: the rows inside."""
    chosen: dict[int, list[str]] = {s: [] for s in range(slots)}
    for name in (f"day/file-{i}.parquet" for i in range(200)):
        s = slot_of(name, slots)
        if len(chosen[s]) < files_per_slot:
            chosen[s].append(name)
    blob = open_blob(str(root))
    model: list[Row] = []
    for name in sorted(n for ns in chosen.values() for n in ns):
        salt = zlib.crc32(name.encode()) % 1000
        mine = [(f"{name}:{i}", salt + i, START + (i * 997) % SPAN, 1) for i in range(rows)]
        t = pa.table({"k": [r[0] for r in mine] + [f"{name}:late"], "n": [r[1] for r in mine] + [0],
                      "event_time": [r[2] for r in mine] + [START + SPAN]})
        buf = io.BytesIO()
        pq.write_table(t, buf)
        blob.put(name, buf.getvalue())
        model += mine
    blob.put("_watermark.json", b'{"watermark": %d}' % (START + 2 * SPAN))
    return model


def minted(tmp_path: Path, url: str, *, slots: int, files_per_slot: int = 1
           ) -> tuple[LandingSource, Description, list[Row]]:
    model = land(tmp_path / "landing", slots=slots, files_per_slot=files_per_slot)
    source = LandingSource(str(tmp_path / "landing"))
    shard = Shard.create(url, SCHEMA, upper=START)
    chain = mint_chain(shard, source, interval_end=START + SPAN, max_span=None, max_chain=1, dag_id="d",
                       run_id="r", attempt=1)
    assert isinstance(chain, list) and isinstance(chain[0], Description)
    return source, chain[0], model


def request(url: str, source: LandingSource, d: Description, slot: int, slots: int) -> IngestWriteRequest:
    return IngestWriteRequest(shard_url=url, source=source_spec(source), desc=d, slot=slot, slots=slots,
                              part_order="unordered")


def released(connect: Any, before: set[str], *, wait: float = 15.0) -> bool:
    """Whether the server's open sessions are back to ``before`` (the event log is written by the
    server's listener thread, a moment after a session closes)."""
    deadline = time.monotonic() + wait
    while connect.open_sessions() != before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)  # the server's listener writes its event log a moment later: polled, bounded
    return True


@pytest.mark.parametrize("backend", ["s3"], indirect=True)  # the store's own races: tests/sim, tests/core
def test_four_concurrent_connect_write_slots_commit_the_description_exactly_once(
        connect: Any, shard_url: str, tmp_path: Path) -> None:
    source, d, model = minted(tmp_path, shard_url, slots=SLOTS)
    before = connect.open_sessions()
    results: dict[int, Any] = {}

    def slot(i: int) -> None:
        try:
            results[i] = run_over_connect(request(shard_url, source, d, i, SLOTS), url=connect.url)
        except BaseException as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(SLOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(isinstance(r, dict) and r["status"] == "staged" for r in results.values()), results
    assert sum(r["rows"] for r in results.values()) == len(model)
    res = append_from_manifests(Shard(shard_url), d, SLOTS)
    assert res.status == "committed" and res.rows == len(model)
    found = audit(open_blob(parse_url(shard_url)), {d.desc_id: model}, url=shard_url)
    assert not found.leaked
    assert released(connect, before)  # every session was released


def test_a_client_killed_mid_write_leaves_the_description_possible_and_the_retry_commits_once(
        connect: Any, tmp_path: Path) -> None:
    url = (tmp_path / "shard").as_uri()
    source, d, model = minted(tmp_path, url, slots=1)
    child = textwrap.dedent(f"""
        import sys, time
        from shardsink import hooks
        from shardsink.spark.request import IngestWriteRequest, decode_request
        from shardsink.spark.connect import run_over_connect

        def staged(**kw):
            print("STAGED", flush=True)
            time.sleep(600)  # the child holds here until the test SIGKILLs it (a killed task)

        hooks.register("write.staged", staged)
        req = decode_request(sys.stdin.read(), IngestWriteRequest)
        run_over_connect(req, url={connect.url!r})
    """)
    env = {**python_env(), "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(encode_request(request(url, source, d, 0, 1)).encode())
    proc.stdin.close()
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"STAGED", line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    shard = Shard(url)
    assert isinstance(shard.fate(d.desc_id, d.lower), StillPossible)
    assert shard.writer().get_manifest(d.desc_id, 0) is None  # only the client writes manifests
    killed_parts = {i.key for i in open_blob(parse_url(url)).list(f"parts/{d.desc_id}/")}
    assert killed_parts
    out = run_over_connect(request(url, source, d, 0, 1), url=connect.url)  # the task's retry
    assert out["status"] == "staged" and out["rows"] == len(model)
    res = append_from_manifests(Shard(url), d, 1)
    assert res.status == "committed" and res.rows == len(model)
    found = audit(open_blob(parse_url(url)), {d.desc_id: model}, url=url)
    assert not (found.referenced & killed_parts)  # the retry's parts, never the killed attempt's


def test_an_unreachable_server_is_a_configuration_error_at_once() -> None:
    url = f"sc://127.0.0.1:{free_port()}/;token=s3cr3t"
    t0 = time.monotonic()
    with (pytest.raises(InvalidConfigurationError, match=r"cannot be reached.*make connect") as e,
          connect_session(url, name="shardsink-write-x-slot0")):
        pass
    assert time.monotonic() - t0 < 30
    assert "s3cr3t" not in str(e.value) and "token=***" in str(e.value)
    assert redacted("sc://h:1/;user_id=a;token=abc") == "sc://h:1/;user_id=a;token=***"


def test_a_python_version_mismatch_is_a_configuration_error(connect: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client tells the server its Python version with each Python function; the server's
    worker refuses another minor version (PYTHON_VERSION_MISMATCH). Simulated by a client that
    reports 3.99."""
    from pyspark.sql.connect import expressions

    real = expressions.PythonUDF.__init__

    def claim_399(self: Any, output_type: Any, eval_type: Any, func: Any, python_ver: str, *a: Any) -> None:
        real(self, output_type, eval_type, func, "3.99", *a)

    monkeypatch.setattr(expressions.PythonUDF, "__init__", claim_399)
    with (pytest.raises(InvalidConfigurationError, match=r"another Python minor version.*same Python 3"),
          connect_session(connect.url, name="mismatch")):
        pass


def test_shardsink_missing_or_of_another_version_on_the_server_is_a_configuration_error(
        connect: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another version: this client claims 9.9. Missing: the probe pickled by reference to a
    module the server's workers cannot import (the real server's ModuleNotFoundError)."""
    import types

    import shardsink
    from shardsink.spark import connect as engine

    monkeypatch.setattr(shardsink, "__version__", "9.9")
    with (pytest.raises(InvalidConfigurationError, match=r"runs shardsink 0.1.0, this worker runs 9.9.*restart"),
          connect_session(connect.url, name="other-version")):
        pass
    monkeypatch.undo()
    absent = types.ModuleType("shardsink_absent_probe")
    code = engine._probe_rows.__code__
    fn = types.FunctionType(code, engine._probe_rows.__globals__, "_probe_rows")
    fn.__module__ = absent.__name__
    fn.__qualname__ = "_probe_rows"
    absent._probe_rows = fn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, absent.__name__, absent)
    monkeypatch.setattr(engine, "_probe_rows", fn)
    with (pytest.raises(InvalidConfigurationError, match=r"cannot import shardsink_absent_probe.*install shardsink"),
          connect_session(connect.url, name="missing")):
        pass


def test_sessions_are_released_after_every_write_also_failed_ones(connect: Any, tmp_path: Path) -> None:
    """Writes that succeed, writes refused by the job (a bad slot), and work that raises inside
    the session: none leaves a session open on the server, nor the process marked as a Connect
    client (pyspark's mark, which makes every later classic session in the process fail)."""
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    url = (tmp_path / "shard").as_uri()
    source, d, _ = minted(tmp_path, url, slots=2)
    before = connect.open_sessions()
    for _ in range(3):
        assert run_over_connect(request(url, source, d, 0, 2), url=connect.url)["status"] == "staged"
    with pytest.raises(RuntimeError, match=r"boom"), connect_session(connect.url, name="raises"):
        raise RuntimeError("boom")
    bad = IngestWriteRequest(shard_url=url, source=source_spec(source), desc=d, slot=0, slots=2,
                             part_order="unordered", schema_mode="strict")
    with pytest.raises(InvalidUsageError):
        run_over_connect(bad.__class__(**{**{f: getattr(bad, f) for f in bad.__struct_fields__}, "slot": 5}),
                         url=connect.url)
    assert released(connect, before)
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def test_the_write_operator_with_engine_connect_stages_through_a_session(
        connect: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ShardWriteOperator(engine="connect")`` (what ``SparkOptions(engine="connect")`` builds): the
    slot is staged by a session of the server the ``spark_connect`` connection names, no spark-submit;
    a missing connection fails the task without retries, naming the connection."""
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from shardsink.airflow.write_operator import ShardWriteOperator
    from shardsink.sinks.description import to_builtins

    url = (tmp_path / "shard").as_uri()
    source, d, model = minted(tmp_path, url, slots=1)
    port = int(connect.url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                       json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}))

    def op(**kw: Any) -> ShardWriteOperator:
        return ShardWriteOperator(task_id="write", shard_url=url, source_spec=source_spec(source), slots=1,
                                  desc=to_builtins(d), slot=0, engine="connect", part_order="unordered", **kw)

    with pytest.raises(AirflowFailException, match=r"invalid configuration.*'nope' is not defined"):
        op(connect_conn_id="nope").execute({})
    op().execute({})
    assert op()._connect_spark is None
    res = append_from_manifests(Shard(url), d, 1)
    assert res.status == "committed" and res.rows == len(model)


def test_a_correction_job_over_connect_makes_the_corrected_range_read_as_the_source_is_now(
        connect: Any, tmp_path: Path) -> None:
    """Re-processing's correction job (``IngestCorrectRequest``) as a client session: one file of
    the committed range re-landed with other rows; the correcting description stages the range's
    correction and its own ordinary rows; once appended, the shard as of its upper holds the
    re-landed rows instead of the old ones, each row once, against the model of this test."""
    from shardsink.spark.request import IngestCorrectRequest

    url = (tmp_path / "shard").as_uri()
    source, d, model = minted(tmp_path, url, slots=1, files_per_slot=2)
    assert run_over_connect(request(url, source, d, 0, 1), url=connect.url)["status"] == "staged"
    assert append_from_manifests(Shard(url), d, 1).rows == len(model)
    files = sorted({r[0].rsplit(":", 1)[0] for r in model})
    fixed, others = files[0], files[1:]
    assert others
    blob = open_blob(str(tmp_path / "landing"))
    again = [(f"{fixed}:fixed{i}", 7000 + i, START + i * 1000) for i in range(3)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": [r[0] for r in again], "n": [r[1] for r in again],
                             "event_time": [r[2] for r in again]}), buf)
    blob.put(fixed, buf.getvalue())  # re-landed: its old rows (and its row past the range) are gone
    fix = Description(desc_id="fix", lower=START + SPAN, upper=START + 2 * SPAN, attempt=1,
                      corrects=(START, START + SPAN))
    got = run_over_connect(IngestCorrectRequest(shard_url=url, source=source_spec(source), desc=fix), url=connect.url)
    assert got["status"] == "staged" and got["corrects"] == [START, START + SPAN]
    assert append_from_manifests(Shard(url), fix, 1).status == "committed"
    want = sorted([(k, n) for k, n, _, _ in model if not k.startswith(f"{fixed}:")]
                  + [(k, n) for k, n, _ in again] + [(f"{o}:late", 0) for o in others])
    snap = Shard(url).snapshot(START + 2 * SPAN - 1)
    assert sorted((r["k"], r["n"]) for r in snap.to_pylist() for _ in range(r["_count"])) == want
    fixes = [p for b in Shard(url).batches() for p in b.parts if p.corrects is not None]
    assert fixes and all(p.corrects == (START, START + SPAN) for p in fixes)


@pytest.mark.parametrize("backend", ["s3"], indirect=True)  # the server's Python workers read the shards
def test_a_view_job_over_connect_corrects_the_view_to_a_from_scratch_computation(connect: Any, shard_url: str) -> None:
    """A view's write job (``ViewWriteRequest``) as a client session: three runs over an S3 input
    that gains rows, retracts one, and whose view gets a foreign row appended by hand; after each
    run the view equals the query computed here from the input's snapshot, and each run's batch
    holds only the rows that changed."""
    from collections import Counter

    from shardsink.sinks.materialize import mint_view, view
    from shardsink.spark.request import ViewWriteRequest

    events = pa.schema([("user", pa.string()), ("amount", pa.int64())])
    src = Shard.create(f"{shard_url}/events", events)
    v = view(inputs={"events": src.url}, sql="SELECT user, sum(amount) AS total FROM events GROUP BY user")
    out_url = f"{shard_url}/view"
    before = connect.open_sessions()

    def put(rows: list[tuple[str, int, int]], lower: int, upper: int) -> None:
        src.append(pa.table({"user": [r[0] for r in rows], "amount": [r[1] for r in rows],
                             "_time": [lower] * len(rows), "_diff": [r[2] for r in rows]},
                            schema=pa.schema([*events, ("_time", pa.int64()), ("_diff", pa.int64())])),
                   lower=lower, upper=upper)

    def model(as_of: int) -> Counter[tuple[str, int]]:
        total: Counter[str] = Counter()
        for r in src.snapshot(as_of).to_pylist():
            total[r["user"]] += r["amount"] * r["_count"]
        return Counter({(u, t): 1 for u, t in total.items()})

    def run(name: str) -> int:
        d = mint_view(v, output_url=out_url, initial_upper=0, interval_end=None, max_span=None, dag_id="v",
                      run_id=name, attempt=1)
        got = run_over_connect(ViewWriteRequest(shard_url=out_url, desc=d, view=v.spec()), url=connect.url)
        assert got["status"] == "staged", got
        res = append_from_manifests(Shard(out_url), d, 1)
        assert res.status == "committed"
        out = Shard(out_url)
        assert Counter({(r["user"], r["total"]): r["_count"] for r in out.snapshot(d.upper - 1).to_pylist()}) \
            == model(d.upper - 1), name
        return res.rows

    put([("a", 5, 1), ("b", 7, 1), ("a", 1, 1)], 0, 10)
    assert run("r1") == 2
    put([("b", 7, -1), ("c", 3, 1)], 10, 20)  # b retracted; c new
    assert run("r2") == 2  # -(b, 7), +(c, 3): b has no rows left
    Shard(out_url).append(pa.table({"user": ["zz"], "total": [9], "_time": [20], "_diff": [1]},
                                   schema=pa.schema([("user", pa.string()), ("total", pa.int64()),
                                                     ("_time", pa.int64()), ("_diff", pa.int64())])),
                          lower=20, upper=21)  # a foreign row in the view
    put([], 20, 30)
    assert run("r3") == 1  # the foreign row retracted, nothing else
    assert released(connect, before)  # each run's session was released


def test_the_server_restarting_mid_write_fails_the_slot_retryably_and_the_retry_commits_once(
        connect: Any, tmp_path: Path) -> None:
    """The server is killed and restarted after the slot's session opened (the next request finds
    its session gone): a retryable StorageError naming the server, nothing published; the retry
    (a new session on the restarted server) commits the description once."""
    from shardsink.errors import StorageError

    url = (tmp_path / "shard").as_uri()
    source, d, model = minted(tmp_path, url, slots=1)

    def restart(spark: Any) -> None:
        if spark is not None:
            connect.restart(kill=True)

    with pytest.raises(StorageError, match="went away or lost the session") as e:
        run_over_connect(request(url, source, d, 0, 1), url=connect.url, on_session=restart)
    assert e.value.retryable and "s3cr3t" not in str(e.value)
    assert Shard(url).writer().get_manifest(d.desc_id, 0) is None
    assert isinstance(Shard(url).fate(d.desc_id, d.lower), StillPossible)
    out = run_over_connect(request(url, source, d, 0, 1), url=connect.url)  # the task's retry
    assert out["status"] == "staged"
    res = append_from_manifests(Shard(url), d, 1)
    assert res.status == "committed" and res.rows == len(model)
    audit(open_blob(parse_url(url)), {d.desc_id: model}, url=url)


def test_spark_options_name_the_engine_and_refuse_an_unknown_one() -> None:
    from shardsink.airflow.build import write_args
    from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions

    with pytest.raises(InvalidUsageError, match="'submit' or 'connect', got 'jvm'"):
        SparkOptions(engine="jvm")  # type: ignore[arg-type]
    args = write_args("file:///s", SparkOptions(engine="connect", connect_conn_id="sc"), ShardOptions(),
                      AttemptOptions(), default_conf={})
    assert (args["engine"], args["connect_conn_id"]) == ("connect", "sc")
    assert SparkOptions().engine == "submit"


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_a_write_slot_checks_the_servers_python_only_before_its_first_python_task(
        connect: Any, tmp_path: Path, shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write session probes the server's Python workers (:func:`probe`) just before its first
    Python task there, not at its start (starting a session's worker daemon is most of a small
    write's cost). Seen through a client claiming shardsink 9.9: a small slot of a local-folder
    shard (read by the client, written by Spark's own writer) runs no Python on the server and
    stages; the same slot read on the executors, or staged to S3 by the executors, is refused."""
    import shardsink
    from shardsink.sources.landing import read as landing_read

    local = (tmp_path / "shard").as_uri()
    source, d, model = minted(tmp_path, local, slots=1)
    monkeypatch.setattr(shardsink, "__version__", "9.9")
    out = run_over_connect(request(local, source, d, 0, 1), url=connect.url)
    assert out["status"] == "staged" and out["rows"] == len(model)
    refused = r"runs shardsink 0.1.0, this worker runs 9.9.*restart"
    with monkeypatch.context() as m:
        m.setattr(landing_read, "IN_CLIENT_BYTES", 0)  # the files are read on the executors
        with pytest.raises(InvalidConfigurationError, match=refused):
            run_over_connect(request(local, source, d, 0, 1), url=connect.url)
    shard = Shard.create(shard_url, SCHEMA, upper=START)
    chain = mint_chain(shard, source, interval_end=START + SPAN, max_span=None, max_chain=1, dag_id="d",
                       run_id="r", attempt=1)
    assert isinstance(chain, list)
    with pytest.raises(InvalidConfigurationError, match=refused):  # parts staged to S3 by the executors
        run_over_connect(request(shard_url, source, chain[0], 0, 1), url=connect.url)
    monkeypatch.undo()
    res = append_from_manifests(Shard(local), d, 1)
    assert res.status == "committed" and res.rows == len(model)


def test_a_file_changed_since_the_mint_is_refused_alike_read_by_the_client_or_the_executors(
        connect: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small slot over Connect is read in the task process, a larger one on the server's
    executors: either way a landing file rewritten since the mint's listing fails the slot as
    invalid input (not retried), naming the file, and stages nothing."""
    from shardsink.sources.landing import read as landing_read

    url = (tmp_path / "shard").as_uri()
    source, d, _ = minted(tmp_path, url, slots=1)
    [changed] = sorted((tmp_path / "landing" / "day").iterdir())
    changed.write_bytes(changed.read_bytes() + b"\0")  # another size than the mint listed
    for in_client in (4 << 20, 0):
        monkeypatch.setattr(landing_read, "IN_CLIENT_BYTES", in_client)
        with pytest.raises(InvalidUsageError, match=r"file-\d+\.parquet changed or disappeared since it was listed"):
            run_over_connect(request(url, source, d, 0, 1), url=connect.url)
    assert not (tmp_path / "shard" / "staging").exists() or not any((tmp_path / "shard" / "staging").rglob("*.json"))
