"""Views whose query changes shape (shardsink.spark.view_schema): a query that gains a column or
widens a type evolves its output shard (a committed schema change) and compares in full; any
other change is refused naming the column, its old and new type and the commands that fix it,
the output unchanged. Real Spark (local[2]), real shards; every expected view is computed from
scratch with pyarrow over the input's snapshot, never from the sink's output."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from shardsink import InvalidUsageError, Shard
from shardsink.core.schema import SchemaChange, current
from shardsink.core.shard import AppendResult
from shardsink.errors import ShardNotFoundError
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.materialize import mint_view, view
from shardsink.spark.incremental import BASIS, FINGERPRINT, output_fingerprint
from shardsink.spark.linear import row_wise_view
from shardsink.spark.view import refresh_view, run_view, write_view
from shardsink.spark.view_schema import Evolution, evolution, evolve_output

SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])
UPDATES = pa.schema([*SCHEMA, ("_time", pa.int64()), ("_diff", pa.int64())])
COUNTS = "SELECT user, count(*) AS events FROM events GROUP BY user"
TOTALS = "SELECT user, count(*) AS events, sum(amount) AS total FROM events GROUP BY user"


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    u, a, t, d = (list(c) for c in zip(*rows, strict=True))
    return pa.table({"user": u, "amount": a, "_time": t, "_diff": d}, schema=UPDATES)


def _totals(src: Shard, as_of: int) -> Counter[tuple[Any, ...]]:
    """``TOTALS`` from scratch over the input's snapshot."""
    events: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for r in src.snapshot(as_of).to_pylist():
        events[r["user"]] += r["_count"]
        total[r["user"]] += r["amount"] * r["_count"]
    return Counter({(u, events[u], total[u]): 1 for u in events if events[u]})


def _rows(out: Shard, as_of: int, *cols: str) -> Counter[tuple[Any, ...]]:
    return Counter({tuple(r[c] for c in cols): r["_count"] for r in out.snapshot(as_of).to_pylist()})


def _state(url: str) -> tuple[Any, ...]:
    try:
        s = Shard.open(url)
    except ShardNotFoundError:
        return ("missing",)
    return (s.info().seqno, s.info().upper, s.schema_history(), sorted(o.key for o in s._machine.blob.list("parts/")))


def _setup(base: str) -> tuple[Shard, str]:
    src = Shard.create(f"{base}/events", SCHEMA)
    src.append(_table([("a", 5, 1, 1), ("a", 1, 2, 1), ("b", 7, 3, 1)]), lower=0, upper=10)
    return src, f"{base}/view"


def test_a_column_the_query_gains_evolves_the_output_and_every_row_is_corrected(spark: Any,
                                                                                shard_url: str) -> None:
    src, out_url = _setup(shard_url)
    refresh_view(spark, view(inputs={"events": src.url}, sql=COUNTS), output_url=out_url)
    out = Shard.open(out_url)
    src.append(_table([("a", 3, 12, 1), ("c", 2, 13, 1)]), lower=10, upper=20)

    grown = view(inputs={"events": src.url}, sql=TOTALS)
    r = refresh_view(spark, grown, output_url=out_url)
    assert isinstance(r, AppendResult) and (r.lower, r.upper) == (10, 20)
    assert out.schema == pa.schema([("user", pa.string()), ("events", pa.int64()), ("total", pa.int64())])
    hist = out.schema_history()
    assert [e.id for e in hist] == [0, 1] and [f.name for f in hist[1].fields] == ["user", "events", "total"]
    assert [f.id for f in hist[1].fields] == [1, 2, 3] and hist[1].upper == 10
    kinds = [(c.kind, getattr(c, "change", None)) for _, c in out.log(limit=3)]
    assert kinds == [("append", None), ("schema", "add total:int64"), ("append", None)]
    assert out.batches()[-1].schema_id == 1
    # A full comparison: every persisted row (read with total NULL) is retracted, every row re-inserted.
    got = Counter({(x["user"], x["events"], x["total"]): x["_diff"] for x in out.changes(10, 20).to_pylist()})
    assert got == Counter({("a", 2, None): -1, ("b", 1, None): -1,
                           ("a", 3, 9): 1, ("b", 1, 7): 1, ("c", 1, 2): 1})
    assert _rows(out, 19, "user", "events", "total") == _totals(src, 19) and len(_totals(src, 19)) == 3
    # history under the schema of its time: before the change, the view had no total
    assert out.snapshot(9, schema="as_of").column_names == ["user", "events", "_count"]

    src.append(_table([("b", 1, 21, 1), ("a", 5, 22, -1)]), lower=20, upper=30)
    refresh_view(spark, grown, output_url=out_url)  # same shape: no further schema change
    assert [e.id for e in out.schema_history()] == [0, 1]
    assert _rows(out, 29, "user", "events", "total") == _totals(src, 29)


def test_a_widened_type_evolves_a_row_wise_view_and_its_fingerprint_covers_the_schema_id(spark: Any,
                                                                                        tmp_path: Any) -> None:
    base = f"file://{tmp_path}"  # the basis logic is backend-neutral: local only (suite time)
    src, out_url = _setup(base)
    narrow, wide = (view(inputs={"events": src.url}, sql=f"SELECT user, CAST(amount AS {t}) AS n FROM events "
                                                           "WHERE amount > 1") for t in ("INT", "BIGINT"))

    def model(as_of: int) -> Counter[tuple[Any, ...]]:
        return Counter({(r["user"], r["amount"]): r["_count"] for r in src.snapshot(as_of).to_pylist()
                        if r["amount"] > 1})

    def props(out: Shard) -> dict[str, str]:
        return dict(next(c for _, c in out.log(limit=3) if c.kind == "append").props)

    refresh_view(spark, narrow, output_url=out_url)
    out = Shard.open(out_url)
    assert out.schema.field("n").type == pa.int32()
    src.append(_table([("c", 4, 11, 1)]), lower=10, upper=20)
    refresh_view(spark, narrow, output_url=out_url)
    before = props(out)
    assert before[BASIS] == "incremental"

    src.append(_table([("d", 9, 21, 1), ("a", 5, 22, -1)]), lower=20, upper=30)
    refresh_view(spark, wide, output_url=out_url)
    assert out.schema.field("n").type == pa.int64()
    assert [getattr(c, "change", None) for _, c in out.log(limit=2)] == [None, "widen n:int64"]
    evolved = props(out)
    assert evolved[BASIS] == "full"  # not the incremental path, though the input's changes would do
    rw = row_wise_view(spark, wide, run=functools.partial(run_view, spark, wide))
    definition = None if rw is None else rw.fingerprint
    assert definition is not None
    assert evolved[FINGERPRINT] == output_fingerprint(definition, 1) != definition
    assert _rows(out, 29, "user", "n") == model(29)

    src.append(_table([("e", 6, 31, 1)]), lower=30, upper=40)
    refresh_view(spark, wide, output_url=out_url)  # builds on the run under schema 1
    assert props(out) == {**evolved, BASIS: "incremental", "view.incremental_run": "1"}
    assert _rows(out, 39, "user", "n") == model(39)


def test_the_fingerprint_changes_with_the_output_schema_id() -> None:
    d = "0123456789abcdef0123456789abcdef"
    fps = [output_fingerprint(d, i) for i in range(4)]
    assert fps[0] == d  # a shard that never evolved keeps the basis it had
    assert len(set(fps)) == 4 and all(fp is not None and len(fp) == 32 for fp in fps)
    assert output_fingerprint(None, 3) is None  # a UDF view stays unfingerprinted


def _cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "shardsink", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_dropped_renamed_or_narrowed_column_is_refused_with_the_commands_that_fix_it(spark: Any,
                                                                                      tmp_path: Any) -> None:
    src, out_url = _setup(f"file://{tmp_path}")
    refresh_view(spark, view(inputs={"events": src.url}, sql=TOTALS), output_url=out_url)
    src.append(_table([("c", 2, 13, 1)]), lower=10, upper=20)
    url = Shard.open(out_url).url
    before = _state(out_url)

    def refused(sql: str) -> str:
        with pytest.raises(InvalidUsageError) as e:
            refresh_view(spark, view(inputs={"events": src.url}, sql=sql), output_url=out_url)
        assert _state(out_url) == before, "a refused view changed its output"
        return str(e.value)

    msg = refused(COUNTS)
    assert "column 'total' (int64) is not in the query's output (dropped or renamed)" in msg
    assert f"`shardsink schema {url} --drop total`" in msg and "a new output shard" in msg
    assert "The output shard was not changed" in msg
    msg = refused("SELECT user, CAST(count(*) AS INT) AS events, sum(amount) AS total FROM events GROUP BY user")
    assert "column 'events' changed from int64 to int32, which is not a widening" in msg
    assert "CAST(events AS BIGINT)" in msg and f"`shardsink schema {url} --drop events`" in msg
    renamed = "SELECT user, count(*) AS events, sum(amount) AS spent FROM events GROUP BY user"
    msg = refused(renamed)
    assert f"`shardsink schema {url} --rename total:spent`" in msg

    # The commands the message names are true: after them the same queries run.
    _cli("schema", url, "--rename", "total:spent")
    r = refresh_view(spark, view(inputs={"events": src.url}, sql=renamed), output_url=out_url)
    assert isinstance(r, AppendResult)
    assert _rows(Shard.open(out_url), 19, "user", "events", "spent") == _totals(src, 19)
    src.append(_table([("a", 1, 21, 1)]), lower=20, upper=30)
    _cli("schema", url, "--drop", "spent")
    refresh_view(spark, view(inputs={"events": src.url}, sql=COUNTS), output_url=out_url)
    out = Shard.open(out_url)
    assert out.schema.names == ["user", "events"]
    assert _rows(out, 29, "user", "events") == Counter({(u, n): 1 for u, n, _ in _totals(src, 29)})


def test_twin_writes_evolve_once_and_the_stale_one_still_commits(spark: Any, shard_url: str) -> None:
    """Two write attempts of one description, the second working from the version before the
    first one's schema change (a twin task): the change is committed once, both manifests name
    the evolved schema id, and the commit holds the view."""
    src, out_url = _setup(shard_url)
    refresh_view(spark, view(inputs={"events": src.url}, sql=COUNTS), output_url=out_url)
    src.append(_table([("a", 3, 12, 1)]), lower=10, upper=20)
    out = Shard.open(out_url)
    stale = out.info().seqno
    grown = view(inputs={"events": src.url}, sql=TOTALS)
    desc = mint_view(grown, output_url=out_url, initial_upper=0, interval_end=None, max_span=None,
                     dag_id="v", run_id="twin", attempt=1)
    assert isinstance(desc, Description)
    first = write_view(spark, grown, output_url=out_url, desc=desc, decided_at=stale)
    second = write_view(spark, grown, output_url=out_url, desc=desc, decided_at=stale)
    assert first["evolved"] == second["evolved"] == "add total:int64"
    assert first["schema_id"] == second["schema_id"] == 1
    assert [e.id for e in out.schema_history()] == [0, 1]
    r = append_from_manifests(out, desc, 1)
    assert r.status == "committed" and out.batches()[-1].schema_id == current(out.reader().head().header).id == 1
    assert _rows(out, 19, "user", "events", "total") == _totals(src, 19)


def test_an_output_schema_a_racer_moved_elsewhere_refuses_the_run_by_name(tmp_path: Any) -> None:
    """No JVM: the output evolves by one exact evolve-to-target commit; a racer that added another
    column first makes the run's target unreachable, refused naming that column, nothing written."""
    out = Shard.create(f"file://{tmp_path}/out", SCHEMA)
    at = out.reader().head()
    evo = evolution(pa.schema([*SCHEMA, ("total", pa.int64())]), at.header, url=out.url)
    assert isinstance(evo, Evolution) and evo.describe() == "add total:int64"
    out.evolve(SchemaChange(kind="add", name="note", type="string"), writer="human")
    before = _state(out.url)
    with pytest.raises(InvalidUsageError, match=r"changed while this run evolved it .*column 'note' differs") as e:
        evolve_output(out, evo, at=at, writer="w")
    assert e.value.value == "note" and _state(out.url) == before
