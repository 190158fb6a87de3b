"""The materialize sink end to end in one process: mint_view → write_view (real Spark,
local[2]) → the ingest sink's append, on a local folder and on S3 (moto over HTTP).

The reference for every check is a from-scratch computation with pyarrow over the
input's snapshot, never the sink's own output."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import InvalidUsageError, Shard
from shardsink.core.shard import AppendResult
from shardsink.errors import ReadFrontierError, ShardNotFoundError
from shardsink.sinks.append import LostRaceError, append_from_manifests
from shardsink.sinks.description import NoOp
from shardsink.sinks.materialize import View, mint_view, view
from shardsink.spark.view import refresh_view, write_view

SCHEMA = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])
SQL = "SELECT user, count(*) AS events, sum(amount) AS total FROM events GROUP BY user"


def _events(rows: list[tuple[str, str, int, int, int]]) -> pa.Table:
    user, action, amount, time, diff = (list(c) for c in zip(*rows, strict=True))
    return pa.table({"user": user, "action": action, "amount": amount, "_time": time, "_diff": diff},
                    schema=pa.schema([*SCHEMA, ("_time", pa.int64()), ("_diff", pa.int64())]))


def _empty() -> pa.Table:
    return pa.table({n: pa.array([], t) for n, t in
                     [("user", pa.string()), ("action", pa.string()), ("amount", pa.int64()),
                      ("_time", pa.int64()), ("_diff", pa.int64())]})


def _expected(src: Shard, as_of: int) -> Counter[tuple[Any, ...]]:
    """The view ``SQL`` computed from scratch over the input's snapshot (pyarrow)."""
    events: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for r in src.snapshot(as_of).to_pylist():
        events[r["user"]] += r["_count"]
        total[r["user"]] += r["amount"] * r["_count"]
    return Counter({(u, events[u], total[u]): 1 for u in events})


def _contents(out: Shard, as_of: int | None = None) -> Counter[tuple[Any, ...]]:
    snap = out.snapshot(as_of)
    return Counter({(r["user"], r["events"], r["total"]): r["_count"] for r in snap.to_pylist()})


def _urls(base: str) -> tuple[str, str]:
    return f"{base}/events", f"{base}/view"


@pytest.fixture
def base(shard_url: str) -> str:
    return shard_url


FIRST = [("a", "buy", 5, 1, 1), ("a", "view", 1, 2, 1), ("b", "buy", 7, 3, 1), ("c", "click", 2, 4, 1)]


def _setup(base: str) -> tuple[Shard, View, str]:
    src_url, out_url = _urls(base)
    src = Shard.create(src_url, SCHEMA)
    src.append(_events(FIRST), lower=0, upper=10)
    return src, view(inputs={"events": src.url}, sql=SQL), out_url


def test_first_run_then_unchanged_rerun_writes_zero_updates(spark: Any, base: str) -> None:
    src, v, out_url = _setup(base)
    r = refresh_view(spark, v, output_url=out_url)
    assert isinstance(r, AppendResult) and (r.lower, r.upper, r.rows) == (0, 10, 3)
    out = Shard.open(out_url)
    assert [f.name for f in out.schema] == ["user", "events", "total"]
    assert _contents(out) == _expected(src, 9)

    assert isinstance(refresh_view(spark, v, output_url=out_url), NoOp)  # the input did not move
    src.append(_empty(), lower=10, upper=20)  # time passes, nothing changes
    r2 = refresh_view(spark, v, output_url=out_url)
    assert isinstance(r2, AppendResult) and (r2.lower, r2.upper, r2.rows) == (10, 20, 0)
    seqno, commit = out.log(limit=1)[0]
    assert (seqno, commit.lower, commit.upper, commit.rows) == (r2.seqno, 10, 20, 0)
    assert sum(b.rows for b in out.batches()) == 3  # the empty batch added no parts
    assert not list(out._machine.blob.list(f"parts/{r2.desc_id}/")), "an unchanged rerun staged part bytes"
    assert _contents(out) == _expected(src, 19)


def test_new_input_writes_exactly_the_changed_rows_with_retractions(spark: Any, tmp_path: Path) -> None:
    src, v, out_url = _setup(f"file://{tmp_path}")
    refresh_view(spark, v, output_url=out_url)
    # 'a' buys again, 'c' disappears (retracted), 'b' is untouched, 'd' is new.
    src.append(_events([("a", "buy", 3, 12, 1), ("c", "click", 2, 13, -1), ("d", "view", 4, 14, 1)]),
               lower=10, upper=20)
    r = refresh_view(spark, v, output_url=out_url)
    assert isinstance(r, AppendResult) and r.rows == 4
    out = Shard.open(out_url)
    got = {(x["user"], x["events"], x["total"], x["_time"]): x["_diff"] for x in out.changes(10, 20).to_pylist()}
    assert got == {("a", 2, 6, 19): -1, ("a", 3, 9, 19): 1, ("c", 1, 2, 19): -1, ("d", 1, 4, 19): 1}
    assert _contents(out) == _expected(src, 19)


def test_foreign_append_via_the_cli_is_undone_by_the_next_run(spark: Any, tmp_path: Path) -> None:
    src, v, out_url = _setup(f"file://{tmp_path}")
    refresh_view(spark, v, output_url=out_url)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("".join(json.dumps(r) + "\n" for r in [
        {"user": "zz", "events": 99, "total": 1, "_time": 11, "_diff": 2},   # rows that should not exist
        {"user": "a", "events": 2, "total": 6, "_time": 12, "_diff": -1},    # a right row retracted
    ]))
    cli = subprocess.run([sys.executable, "-m", "shardsink", "append", out_url, "--lower", "10", "--upper", "15",
                          "--input", str(junk)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    out = Shard.open(out_url)
    assert _contents(out) != _expected(src, 9)
    src.append(_empty(), lower=10, upper=20)
    r = refresh_view(spark, v, output_url=out_url)
    assert isinstance(r, AppendResult) and (r.lower, r.upper, r.rows) == (15, 20, 2)
    assert _contents(out) == _expected(src, 19)


def test_racing_runs_converge_to_a_from_scratch_computation(spark: Any, tmp_path: Path) -> None:
    src, v, out_url = _setup(f"file://{tmp_path}")

    def mint(run: str) -> Any:
        d = mint_view(v, output_url=out_url, initial_upper=0, interval_end=None, max_span=None, dag_id="v",
                      run_id=run, attempt=1)
        assert not isinstance(d, NoOp)
        return d

    # Race 1: A minted [0, 10); the input moves on; B mints [0, 20) and commits first.
    a = mint("A")
    src.append(_events([("b", "buy", 1, 15, 1), ("a", "buy", 5, 16, -1)]), lower=10, upper=20)
    b = mint("B")
    assert (a.lower, a.upper, b.lower, b.upper) == (0, 10, 0, 20)
    for d in (a, b):
        write_view(spark, v, output_url=out_url, desc=d)
    out = Shard.open(out_url)
    append_from_manifests(out, b, 1)
    with pytest.raises(LostRaceError, match="shard upper is 20"):
        append_from_manifests(out, a, 1)
    assert not list(out._machine.blob.list(f"parts/{a.desc_id}/")), "the loser's parts were not deleted"
    assert isinstance(refresh_view(spark, v, output_url=out_url), NoOp)  # A's fresh mint: nothing left

    # Race 2: C and D mint the same [20, 30); C commits, D loses and re-mints [30, 40) fresh.
    src.append(_events([("e", "view", 2, 25, 1)]), lower=20, upper=30)
    c, d = mint("C"), mint("D")
    for x in (c, d):
        write_view(spark, v, output_url=out_url, desc=x)
    append_from_manifests(out, c, 1)
    src.append(_events([("e", "view", 2, 35, 1)]), lower=30, upper=40)
    with pytest.raises(LostRaceError):
        append_from_manifests(out, d, 1)
    r = refresh_view(spark, v, output_url=out_url, run_id="D-retry")
    assert isinstance(r, AppendResult) and (r.lower, r.upper) == (30, 40)

    scratch = f"file://{tmp_path}/scratch"
    refresh_view(spark, v, output_url=scratch, run_id="scratch")
    assert _contents(out, 39) == _contents(Shard.open(scratch), 39) == _expected(src, 39)
    assert _contents(out, 19) == _expected(src, 19) and _contents(out, 29) == _expected(src, 29)


def test_snapshots_at_past_times_reproduce_the_views_history(spark: Any, tmp_path: Path) -> None:
    src, v, out_url = _setup(f"file://{tmp_path}")
    changes = [
        [("a", "buy", 5, 11, -1), ("f", "buy", 8, 12, 1)],
        [("b", "buy", 7, 25, -1), ("f", "buy", 8, 26, 1)],
        [("f", "view", 1, 33, 1)],
    ]
    refresh_view(spark, v, output_url=out_url)
    for i, rows in enumerate(changes, start=1):
        src.append(_events(rows), lower=10 * i, upper=10 * (i + 1))
        refresh_view(spark, v, output_url=out_url)
    out = Shard.open(out_url)
    assert out.info().upper == 40
    for t in (9, 15, 19, 29, 39):  # between runs the view holds what the last run computed (at upper - 1)
        assert _contents(out, t) == _expected(src, (t + 1) // 10 * 10 - 1), t


def _python_view(spark: Any, inputs: Mapping[str, Any]) -> Any:
    from pyspark.sql import functions as F

    return inputs["events"].groupBy("user").agg(F.count("*").alias("events"), F.sum("amount").alias("total"))


def test_python_function_view_and_updates_input(spark: Any, tmp_path: Path) -> None:
    src, _, _ = _setup(f"file://{tmp_path}")
    py = view(inputs={"events": src.url}, function=_python_view)
    out_url = f"file://{tmp_path}/py"
    refresh_view(spark, py, output_url=out_url)
    assert _contents(Shard.open(out_url)) == _expected(src, 9)
    from shardsink.sinks.materialize import ViewInput

    per_time = view(inputs={"events": ViewInput(src.url, mode="updates")},
                    sql="SELECT user, _time AS t, sum(_diff) AS n FROM events GROUP BY user, _time")
    refresh_view(spark, per_time, output_url=f"file://{tmp_path}/upd")
    got = sorted((r["user"], r["t"], r["n"]) for r in Shard.open(f"file://{tmp_path}/upd").snapshot().to_pylist())
    assert got == [("a", 1, 1), ("a", 2, 1), ("b", 3, 1), ("c", 4, 1)]


# --- bad input: a clear error, the output shard unchanged -------------------------------------


def _state(url: str) -> tuple[Any, ...]:
    try:
        s = Shard.open(url)
    except ShardNotFoundError:
        return ("missing",)
    return (s.info().seqno, s.info().upper, sorted(o.key for o in s._machine.blob.list("parts/")))


def test_view_over_a_missing_input_shard_is_refused(spark: Any, tmp_path: Path) -> None:
    src, _, out_url = _setup(f"file://{tmp_path}")
    refresh_view(spark, view(inputs={"events": src.url}, sql=SQL), output_url=out_url)
    before = _state(out_url)
    ghost = f"file://{tmp_path}/no-such-shard"
    bad = view(inputs={"events": src.url, "other": ghost}, sql=SQL)
    with pytest.raises(ShardNotFoundError, match=f"view input 'other' names no shard: {ghost}"):
        refresh_view(spark, bad, output_url=out_url)
    assert _state(out_url) == before


def test_failing_query_and_schema_change_are_refused_output_unchanged(spark: Any, base: str) -> None:
    src, v, out_url = _setup(base)
    with pytest.raises(InvalidUsageError, match=r"the view query failed in Spark: .*nope"):
        refresh_view(spark, view(inputs={"events": src.url}, sql="SELECT nope FROM events"), output_url=out_url)
    assert _state(out_url) == ("missing",)  # a failing first run creates nothing
    refresh_view(spark, v, output_url=out_url)
    src.append(_empty(), lower=10, upper=20)
    before = _state(out_url)
    changed = view(inputs={"events": src.url},
                   sql="SELECT user, count(*) AS events, sum(amount) * 1.5 AS total, 1 AS x FROM events GROUP BY user")
    # x alone would be added (a nullable column); total bigint -> decimal is no widening: refused
    with pytest.raises(InvalidUsageError, match=r"column 'total' changed from int64 to decimal128\(.*\), which is "
                                                r"not a widening.*--drop total.*CAST\(total AS BIGINT\)"):
        refresh_view(spark, changed, output_url=out_url)
    with pytest.raises(InvalidUsageError, match="the view query failed in Spark"):
        refresh_view(spark, view(inputs={"events": src.url}, sql="SELEC oops"), output_url=out_url)
    assert _state(out_url) == before


def test_input_compacted_past_the_views_time_is_refused(spark: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _src, v, out_url = _setup(f"file://{tmp_path}")
    from dataclasses import replace

    from shardsink.core.machine import Machine

    real = Machine.head

    def head(self: Machine) -> Any:  # the input's since moved to 10 (as compaction would)
        h = real(self)
        if self.blob.url.rstrip("/").endswith("/events"):
            return replace(h, version=replace(h.version, header=replace(h.version.header, since=10)))
        return h

    monkeypatch.setattr(Machine, "head", head)
    with pytest.raises(ReadFrontierError, match=r"view input 'events' .* cannot be read as of 9: its since is 10"):
        refresh_view(spark, v, output_url=out_url)
    assert _state(out_url) == ("missing",)


def test_view_spec_round_trips_and_bad_definitions_are_refused() -> None:
    v = view(inputs={"events": "/tmp/x/" + uuid.uuid4().hex}, sql=SQL)
    assert View.from_spec(json.loads(json.dumps(v.spec()))) == v
    with pytest.raises(InvalidUsageError, match="exactly one of"):
        view(inputs={"events": "/tmp/x"})
    with pytest.raises(InvalidUsageError, match="input names"):
        view(inputs={"bad-name": "/tmp/x"}, sql=SQL)


def test_compact_parts_are_smaller_for_sparse_corrections_and_read_back_identically(tmp_path: Path) -> None:
    import numpy as np

    from shardsink.core.part_io import read_parts, write_parts
    from shardsink.storage.url import open_blob

    rng = np.random.default_rng(3)
    n = 4000
    ids = np.sort(rng.choice(1_000_000, n, replace=False))
    amount = np.round(rng.gamma(2.0, 20.0, n), 2)
    t = pa.table({"id": ids, "kind": np.array(["a", "b", "c"], dtype=object)[ids % 3], "amount": amount,
                  "_time": np.full(n, 19), "_diff": np.where(ids % 2 == 0, 1, -1)})
    blob = open_blob(f"file://{tmp_path}/parts")
    (plain,) = write_parts(blob, t, prefix="p/default")
    (compact,) = write_parts(blob, t, prefix="p/compact", encoding="compact")
    assert compact.bytes < 0.8 * plain.bytes, (compact.bytes, plain.bytes)
    schema = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("amount", pa.float64())])
    assert read_parts(blob, [compact], schema).equals(read_parts(blob, [plain], schema))
