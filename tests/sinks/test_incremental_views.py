"""Row-wise views corrected from their input's changes alone (shardsink.spark.incremental):
after every run the output must equal the view computed from scratch (pyarrow) over the
input's snapshot, whichever basis the run took; and a run may go incremental only when
the output's newest content commit is a run of the same definition. Real Spark
(local[2]); the random rounds and the twin attempts run on both backends, the rest of
the basis logic (backend-neutral) on the local one."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa

from shardsink import Shard
from shardsink.core.shard import AppendResult
from shardsink.maintenance.compact import compact_batches
from shardsink.maintenance.since import advance_since
from shardsink.sinks.materialize import view
from shardsink.spark.incremental import BASIS, FINGERPRINT
from shardsink.spark.view import refresh_view

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])
UPDATES = pa.schema([*SCHEMA, ("_time", pa.int64()), ("_diff", pa.int64())])
SQL = "SELECT k, n + 1 AS m FROM events WHERE n % 3 <> 0"
OTHER_SQL = "SELECT k, n + 1 AS m FROM events WHERE n % 2 <> 0"


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    if not rows:
        return UPDATES.empty_table()
    k, n, t, d = (list(c) for c in zip(*rows, strict=True))
    return pa.table({"k": k, "n": n, "_time": t, "_diff": d}, schema=UPDATES)


def _model(src: Shard, as_of: int, modulo: int) -> Counter[tuple[Any, ...]]:
    """The view from scratch over the input's snapshot (``NULL % m <> 0`` is not true)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in src.snapshot(as_of).to_pylist():
        if r["n"] is not None and r["n"] % modulo != 0:
            out[(r["k"], r["n"] + 1)] += r["_count"]
    return out


def _contents(out: Shard, as_of: int) -> Counter[tuple[Any, ...]]:
    return Counter({(r["k"], r["m"]): r["_count"] for r in out.snapshot(as_of).to_pylist()})


def _basis(out: Shard) -> str | None:
    """The basis the newest append of ``out`` recorded."""
    info = next(c for _, c in out.log(limit=5) if c.kind == "append")
    return dict(info.props).get(BASIS)


def _random_batch(rng: random.Random, live: Counter[tuple[Any, ...]], t: int) -> list[tuple[Any, ...]]:
    """Insertions (some repeated, some NULL), whole and partial retractions of live rows."""
    rows: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(0, 12)):
        row = (rng.choice(["a", "b", None]), rng.choice([None, *range(8)]))
        d = rng.choice([1, 1, 2, 3])
        rows.append((*row, t, d))
        live[row] += d
    for row in rng.sample(sorted(live, key=str), k=min(len(live), rng.randint(0, 4))):
        d = rng.randint(1, live[row])
        rows.append((*row, t, -d))
        live[row] -= d
    return rows


def test_incremental_runs_equal_a_from_scratch_view_over_random_rounds(spark: Any, shard_url: str) -> None:
    rng = random.Random(11)
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    v = view(inputs={"events": src.url}, sql=SQL)
    live: Counter[tuple[Any, ...]] = Counter()
    bases = []
    for r in range(6):
        lower = r * 10
        src.append(_table(_random_batch(rng, live, lower + rng.randint(0, 9))), lower=lower, upper=lower + 10)
        got = refresh_view(spark, v, output_url=out_url, run_id=f"r{r}")
        assert isinstance(got, AppendResult) and got.upper == lower + 10
        out = Shard.open(out_url)
        assert _contents(out, lower + 9) == _model(src, lower + 9, 3), f"round {r}"
        bases.append(_basis(out))
    assert bases == ["full"] + ["incremental"] * 5
    for r in range(6):  # history kept, every round
        assert _contents(Shard.open(out_url), r * 10 + 9) == _model(src, r * 10 + 9, 3)


def test_a_changed_definition_or_a_foreign_append_compares_in_full_and_corrects(spark: Any,
                                                                                tmp_path: Any) -> None:
    shard_url = f"file://{tmp_path}"  # the basis logic is backend-neutral: local only (suite time)
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    src.append(_table([("a", 1, 1, 1), ("b", 2, 2, 1), ("c", 4, 3, 2)]), lower=0, upper=10)
    first = view(inputs={"events": src.url}, sql=SQL)
    refresh_view(spark, first, output_url=out_url)
    out = Shard.open(out_url)
    fp_first = dict(next(c for _, c in out.log(limit=3) if c.kind == "append").props)[FINGERPRINT]

    src.append(_table([("d", 5, 11, 1), ("a", 1, 12, -1)]), lower=10, upper=20)
    second = view(inputs={"events": src.url}, sql=OTHER_SQL)
    refresh_view(spark, second, output_url=out_url, run_id="changed")
    assert _basis(out) == "full"
    assert _contents(out, 19) == _model(src, 19, 2)
    fp_second = dict(next(c for _, c in out.log(limit=3) if c.kind == "append").props)[FINGERPRINT]
    assert fp_second != fp_first

    # a row written into the output by someone else: the next run cannot build on it
    out.append(pa.table({"k": ["zz"], "m": [99], "_time": [20], "_diff": [1]},
                        schema=pa.schema([("k", pa.string()), ("m", pa.int64()), ("_time", pa.int64()),
                                          ("_diff", pa.int64())])), lower=20, upper=25, desc_id="foreign")
    src.append(_table([("e", 7, 21, 1)]), lower=20, upper=30)
    refresh_view(spark, second, output_url=out_url, run_id="after-foreign")
    assert _basis(out) == "full"
    assert _contents(out, 29) == _model(src, 29, 2)  # the foreign row is retracted

    src.append(_table([("f", 9, 31, 1)]), lower=30, upper=40)
    refresh_view(spark, second, output_url=out_url, run_id="steady")
    assert _basis(out) == "incremental"
    assert _contents(out, 39) == _model(src, 39, 2)


def test_output_compaction_keeps_the_basis_and_input_compaction_past_lower_drops_it(spark: Any,
                                                                                    tmp_path: Any) -> None:
    shard_url = f"file://{tmp_path}"  # the basis logic is backend-neutral: local only (suite time)
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    v = view(inputs={"events": src.url}, sql=SQL)
    for r in range(3):
        src.append(_table([(f"k{r}", r + 1, r * 10, 1), (f"k{r}", 5, r * 10 + 1, 2)]), lower=r * 10,
                   upper=r * 10 + 10)
        refresh_view(spark, v, output_url=out_url, run_id=f"r{r}")
    out = Shard.open(out_url)
    head = out._machine.head().version
    compact_batches(out, out._machine.full_batches(head), since=head.header.since)
    assert out.log(limit=1)[0][1].kind == "compact"

    src.append(_table([("k0", 1, 30, -1), ("x", 7, 31, 1)]), lower=30, upper=40)
    refresh_view(spark, v, output_url=out_url, run_id="after-output-compaction")
    assert _basis(out) == "incremental"
    assert _contents(out, 39) == _model(src, 39, 3)

    # the input's since moves to 40 = the next run's lower: its changes in [40, 50) would
    # hold older updates advanced to 40, so the run must compare in full
    src.append(_table([("y", 8, 45, 1), ("x", 7, 46, -1)]), lower=40, upper=50)
    assert advance_since(src, target=40).after == 40
    refresh_view(spark, v, output_url=out_url, run_id="after-input-compaction")
    assert _basis(out) == "full"
    assert _contents(out, 49) == _model(src, 49, 3)


def test_full_every_bounds_the_incremental_runs_in_a_row(spark: Any, tmp_path: Any) -> None:
    shard_url = f"file://{tmp_path}"  # the basis logic is backend-neutral: local only (suite time)
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    v = view(inputs={"events": src.url}, sql=SQL, full_every=3)
    bases = []
    for r in range(7):
        src.append(_table([(f"k{r}", r + 1, r * 10, 1)]), lower=r * 10, upper=r * 10 + 10)
        refresh_view(spark, v, output_url=out_url, run_id=f"r{r}")
        out = Shard.open(out_url)
        bases.append(_basis(out))
        assert _contents(out, r * 10 + 9) == _model(src, r * 10 + 9, 3)
    assert bases == ["full", "incremental", "incremental"] * 2 + ["full"]


def test_a_view_with_a_udf_is_never_incremental(spark: Any, tmp_path: Any) -> None:
    from pyspark.sql.types import LongType

    spark.udf.register("plus_one", lambda n: None if n is None else n + 1, LongType())
    shard_url = f"file://{tmp_path}"  # the basis logic is backend-neutral: local only (suite time)
    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    v = view(inputs={"events": src.url}, sql="SELECT k, plus_one(n) AS m FROM events WHERE n % 3 <> 0")
    for r in range(2):
        src.append(_table([(f"k{r}", r + 1, r * 10, 1)]), lower=r * 10, upper=r * 10 + 10)
        refresh_view(spark, v, output_url=out_url, run_id=f"r{r}")
        out = Shard.open(out_url)
        assert _basis(out) is None
        assert _contents(out, r * 10 + 9) == _model(src, r * 10 + 9, 3)


def test_a_retried_write_with_another_definition_commits_its_own_fingerprint(spark: Any, shard_url: str) -> None:
    """Two write attempts of one description (a task retried after its DAG file changed):
    the commit pairs the last manifest's parts with that manifest's props, so the next
    run builds on the definition whose rows were committed, never the other one."""
    from shardsink.sinks.append import append_from_manifests
    from shardsink.sinks.description import Description
    from shardsink.sinks.materialize import mint_view
    from shardsink.spark.view import write_view

    src = Shard.create(f"{shard_url}/events", SCHEMA)
    out_url = f"{shard_url}/view"
    first, second = (view(inputs={"events": src.url}, sql=q) for q in (SQL, OTHER_SQL))
    src.append(_table([("a", 1, 1, 1), ("b", 2, 2, 1), ("c", 3, 3, 1)]), lower=0, upper=10)
    refresh_view(spark, first, output_url=out_url)
    src.append(_table([("d", 5, 11, 1), ("e", 4, 12, 1)]), lower=10, upper=20)
    desc = mint_view(first, output_url=out_url, initial_upper=0, interval_end=None, max_span=None,
                     dag_id="t", run_id="twin", attempt=1)
    assert isinstance(desc, Description)
    assert write_view(spark, first, output_url=out_url, desc=desc)["basis"] == "incremental"
    assert write_view(spark, second, output_url=out_url, desc=desc)["basis"] == "full"  # replaces the manifest
    append_from_manifests(Shard.open(out_url), desc, 1)
    out = Shard.open(out_url)
    assert _basis(out) == "full" and _contents(out, 19) == _model(src, 19, 2)

    src.append(_table([("f", 7, 21, 1), ("b", 2, 22, -1)]), lower=20, upper=30)
    refresh_view(spark, first, output_url=out_url, run_id="back-to-first")
    assert _basis(out) == "full" and _contents(out, 29) == _model(src, 29, 3)
