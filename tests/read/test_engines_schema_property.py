"""Property test (issue 19): every engine reads an evolving shard as the same independent model.

Hypothesis generates shard histories (:class:`support.schema_model.SchemaModel`: appends of
inserts and retractions, schema changes add/drop/rename/widen int32 → int64 and string →
large_string, compactions, since advances). Added and renamed columns take hostile names
(:data:`NAMES`: a glob and a regex that Polars' ``pl.col`` would expand, a dot and a backtick
that Spark would parse, a space, other cases of the shard's own names); a name equal ignoring
case to another column must be refused, naming both, and nothing committed (issue 32).
For each history, at a sample of read times (both ends of the readable range, either side
of every schema change, a middle), the snapshots and change feeds read through pyarrow
(``Shard.snapshot``/``changes``), DuckDB (:func:`shardsink.read.duckdb`) and Polars
(:func:`shardsink.read.polars`) equal the model, under ``schema="current"`` and
``schema="as_of"``: the column names, the column types (as each engine spells them) and the
multiset of rows.

pyarrow reads every readable time. On S3 (moto over HTTP) fewer histories and read times.

Spark is slow (a cold session's first queries cost most), so it reads only the
:data:`SPARK_HISTORIES` most varied histories, once hypothesis is done, through
:class:`shardsink.spark.read.ShardReads` planned natively (``native="always"``) and through
the Python data source (``native="never"``): per path, a snapshot and a change feed of each
history, the two histories together covering both modes under both schema choices
(:func:`spark_reads`), all in one Spark job (a union of the reads, each row as JSON). A Spark
failure is reported with the history's steps (``SchemaModel.log``) rather than shrunk.
"""

from __future__ import annotations

import functools
import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.schema_model import CREATE_SCHEMA, KINDS, SchemaModel

import shardsink.read
from shardsink import InvalidUsageError, Shard
from shardsink.core.schema import SchemaChange
from shardsink.maintenance import CompactOptions, MergeOptions, ScheduleOptions, advance_since, compact
from shardsink_dev.testing import MotoServer, local_spark

Mode = Literal["snapshot", "changes"]
Choice = Literal["current", "as_of"]
HISTORIES, SEGMENTS, SPARK_HISTORIES, S3_HISTORIES = 14, 5, 2, 3
#: The names adds and renames draw from (``a`` and ``b`` are the created columns; the order
#: steers the derandomized draws so that every name is read and some change is refused).
NAMES = ("A", "*", "^a.*$", "a.b", "x y", "`q`", "MiXed", "mixed")
#: Each engine's spelling of the model's types.
SPELLING = {
    "pyarrow": {"int32": "int32", "int64": "int64", "string": "string", "large_string": "large_string"},
    "duckdb": {"int32": "INTEGER", "int64": "BIGINT", "string": "VARCHAR", "large_string": "VARCHAR"},
    "polars": {"int32": "Int32", "int64": "Int64", "string": "String", "large_string": "String"},
    "spark": {"int32": "int", "int64": "bigint", "string": "string", "large_string": "string"},
}


@pytest.fixture(scope="session")
def spark(moto: MotoServer) -> Iterator[Any]:
    """The suite's one local[2] session (``local_spark`` reuses it; as tests/spark/conftest.py)."""
    with local_spark() as session:
        yield session


@dataclass(frozen=True)
class Read:
    """One read: a snapshot at ``lo`` (``hi`` unused) or the change feed ``[lo, hi)``."""

    mode: Mode
    choice: Choice
    lo: int
    hi: int = 0

    def expected(self, model: SchemaModel) -> tuple[list[str], list[str], Counter[tuple[Any, ...]]]:
        """The model's column names, type aliases and rows (``(*values, count)`` or
        ``(*values, time, diff)``) of this read."""
        at = self.lo if self.mode == "snapshot" else max(self.lo, self.hi - 1)
        fields = model.fields if self.choice == "current" else model.schema_at(at)
        names, types = [n for _, n, _ in fields], [t for _, _, t in fields]
        if self.mode == "snapshot":
            return [*names, "_count"], [*types, "int64"], model.snapshot(self.lo, fields)
        return [*names, "_time", "_diff"], [*types, "int64", "int64"], model.changes(self.lo, self.hi, fields)


# --- histories -------------------------------------------------------------------------


def build_history(data: st.DataObject, url: str) -> tuple[Shard, SchemaModel]:
    """A shard at ``url`` and its model after a drawn history: an append, then 1 to
    :data:`SEGMENTS` segments of a schema change (or none), one or two appends, and maybe a
    since advance and a compaction (so every schema id holds rows and compactions merge)."""
    model = SchemaModel(int_values=(0, 1, None), int64_values=(0, 2, 2**40, None), spellings=NAMES)
    shard = Shard.create(url, CREATE_SCHEMA)
    append(data, shard, model)
    for _ in range(data.draw(st.integers(1, SEGMENTS), label="segments")):
        kind = data.draw(st.sampled_from([*KINDS, "none"]), label="change")
        drawn = None if kind == "none" else model.draw_change(data, kind)
        if drawn is not None and (twin := model.twin(drawn[0])) is not None:
            refuse(shard, model, drawn[0], twin)
        elif drawn is not None:
            shard.evolve(drawn[0])
            model.evolved(*drawn)
        for _ in range(data.draw(st.integers(1, 2), label="appends")):
            append(data, shard, model)
        if data.draw(st.booleans(), label="advance"):
            target = data.draw(st.integers(model.since, model.upper - 1))
            model.advanced(advance_since(shard, target=target).after)
        if data.draw(st.booleans(), label="compact"):
            fan_in, streamed = data.draw(st.integers(2, 3)), data.draw(st.booleans())
            opts = CompactOptions(schedule=ScheduleOptions(fan_in=fan_in),
                                  merge=MergeOptions(small_bytes=0 if streamed else 1 << 30, batch_rows=2))
            res = compact(shard, options=opts)
            assert all(m.status == "applied" for m in res.merges), res
            model.log.append(f"compact fan_in={fan_in} streamed={streamed}: {len(res.merges)} merges")
    return shard, model


def refuse(shard: Shard, model: SchemaModel, change: SchemaChange, twin: str) -> None:
    """``change`` names a column equal ignoring case to ``twin``: refused naming both, nothing committed."""
    before = shard.info().seqno
    new = change.name if change.kind == "add" else change.new_name
    with pytest.raises(InvalidUsageError, match="equal ignoring case") as e:
        shard.evolve(change)
    assert repr(twin) in str(e.value) and repr(new) in str(e.value), e.value
    assert shard.info().seqno == before
    model.log.append(f"refused @{model.upper}: {change.describe()} (beside {twin!r})")


def append(data: st.DataObject, shard: Shard, model: SchemaModel) -> None:
    span = data.draw(st.integers(1, 3))
    rows = model.draw_append(data, span)
    shard.append(model.table(rows), lower=model.upper, upper=model.upper + span)
    model.appended(rows, span)


def variety(model: SchemaModel) -> int:
    """How many kinds of step a history holds (to pick the histories Spark reads)."""
    kinds = {k for _, k in model.evolutions}
    compacted = any(line.startswith("compact") and not line.endswith(": 0 merges") for line in model.log)
    retracted = any(d < 0 for _, _, d in model.updates)
    return len(kinds) + compacted + retracted + (model.since > 0) + min(len(model.updates), 6) // 3


def sample_reads(model: SchemaModel, *, few: bool = False) -> list[Read]:
    """Reads at both ends of ``[since, upper)``, its middle and either side of each schema
    change (``few``: the ends and the first change only), under both schema choices."""
    lo, hi = model.since, model.upper
    if hi <= lo:
        return []
    bounds = sorted({u for u in model.change_uppers() if lo < u < hi})[: 1 if few else None]
    times = {lo, hi - 1} | {x for u in bounds for x in (u - 1, u)} | (set() if few else {(lo + hi) // 2})
    windows = {(lo, hi)} | {w for u in bounds[:1] for w in ((u - 1, u + 1), (lo, u))}
    if not few:
        windows |= {(lo, lo), (min(lo + 1, hi), hi)} | {w for u in bounds for w in ((lo, u), (u, hi))}
    reads = [Read("snapshot", c, t) for t in sorted(times) for c in ("current", "as_of")]
    return reads + [Read("changes", c, a, b) for a, b in sorted(windows) for c in ("current", "as_of")]


# --- engines ---------------------------------------------------------------------------


def as_counter(rows: Sequence[Sequence[Any]], where: str) -> Counter[tuple[Any, ...]]:
    """Result rows ``(*key, value)`` as ``{key: value}``; each key once (consolidated)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        key = tuple(r[:-1])
        assert key not in out, f"{where}: row {key} twice"
        out[key] = r[-1]
    return out


def read_local(engine: str, shard: Shard, r: Read, con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[str],
                                                                                           list[tuple[Any, ...]]]:
    """``r`` through ``engine``: the result's column names, type spellings and rows."""
    if engine == "pyarrow":
        t = shard.snapshot(r.lo, schema=r.choice) if r.mode == "snapshot" else shard.changes(r.lo, r.hi,
                                                                                           schema=r.choice)
        return t.column_names, [str(f.type) for f in t.schema], [tuple(x.values()) for x in t.to_pylist()]
    kw: dict[str, Any] = {"as_of": r.lo} if r.mode == "snapshot" else {"changes": (r.lo, r.hi)}
    if engine == "duckdb":
        with shardsink.read.duckdb(con, shard.url, schema=r.choice, **kw) as rel:
            return rel.columns, [str(t) for t in rel.types], rel.fetchall()
    with shardsink.read.polars(shard.url, schema=r.choice, **kw) as lf:
        df = lf.collect()
        return df.columns, [str(t) for t in df.dtypes], df.rows()


def check(engine: str, r: Read, model: SchemaModel, got: tuple[list[str], list[str], Sequence[Sequence[Any]]]) -> None:
    names, types, want = r.expected(model)
    where = f"{engine} {r}"
    history = "\n  ".join(["history:", *model.log])
    assert got[0] == names, f"{where}: columns {got[0]}, expected {names}\n{history}"
    assert got[1] == [SPELLING[engine.split()[0]][t] for t in types], f"{where}: types {got[1]} for {types}\n{history}"
    rows = as_counter(got[2], where)
    assert rows == want, f"{where}: got {dict(rows)}, expected {dict(want)}\n{history}"


def check_local_engines(shard: Shard, model: SchemaModel, *, few: bool = False) -> None:
    """pyarrow at every readable time (``few``: at the small sample), and DuckDB and Polars at
    the sample (:func:`sample_reads`), equal the model."""
    con = duckdb.connect()
    sample = sample_reads(model, few=few)
    every = [] if few else [Read("snapshot", c, t) for t in range(model.since, model.upper)
                            for c in ("current", "as_of")]
    for r in every + [r for r in sample if few or r.mode == "changes"]:
        check("pyarrow", r, model, read_local("pyarrow", shard, r, con))
    for r in sample:
        for engine in ("duckdb", "polars"):
            check(engine, r, model, read_local(engine, shard, r, con))


def inner_change(model: SchemaModel) -> int | None:
    """The upper of the first schema change strictly inside the readable range, if any."""
    return next((u for u in model.change_uppers() if model.since < u < model.upper), None)


def spark_reads(model: SchemaModel, half: int) -> list[Read]:
    """Two reads of a history for Spark, ``half`` 0 or 1, so that two histories cover both
    modes under both schema choices, each where the choice matters (just before the first
    schema change inside the readable range, ``u``): 0, the snapshot at ``u - 1`` under its
    own schema (``as_of``) and the feed ``[u - 1, u + 1)`` under ``current``; 1, the snapshot
    at ``u - 1`` under ``current`` and the feed ``[since, u)`` under ``as_of``."""
    lo, hi, u = model.since, model.upper, inner_change(model)
    if u is None:
        return [Read("snapshot", "as_of", hi - 1), Read("changes", "current", lo, hi)] if half == 0 else \
            [Read("snapshot", "current", lo), Read("changes", "as_of", lo, hi)]
    if half == 0:
        return [Read("snapshot", "as_of", u - 1), Read("changes", "current", u - 1, u + 1)]
    return [Read("snapshot", "current", u - 1), Read("changes", "as_of", lo, u)]


def check_spark(spark: Any, histories: Sequence[tuple[Shard, SchemaModel]]) -> tuple[int, set[str]]:
    """Spark equals the model on ``histories`` (:func:`spark_reads`, alternate halves), natively
    planned and through the data source; all those reads in one Spark job. Returns how many
    were checked, and the column names read."""
    from pyspark.sql import functions as F

    from shardsink.spark.diff_sums import cols
    from shardsink.spark.read import ShardReads

    reads = [(native, s, m, r) for native in ("always", "never") for i, (s, m) in enumerate(histories)
             for r in spark_reads(m, i % 2)]
    frames = []
    with ShardReads(spark, native="always") as fast, ShardReads(spark, native="never") as slow:
        for i, (native, s, _, r) in enumerate(reads):
            sr = fast if native == "always" else slow
            df = sr.snapshot(s.url, r.lo, schema=r.choice) if r.mode == "snapshot" else \
                sr.changes(s.url, r.lo, r.hi, schema=r.choice)
            row = F.to_json(F.struct(*cols(df.columns)), {"ignoreNullFields": "false"})
            frames.append((df, df.select(F.lit(i).alias("read"), row.alias("row"))))
        got: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(len(reads))}
        for x in functools.reduce(lambda a, b: a.unionByName(b), [f for _, f in frames]).collect():
            got[x["read"]].append(tuple(json.loads(x["row"]).values()))
    for i, (native, _, m, r) in enumerate(reads):
        df = frames[i][0]
        spelled = [f.dataType.simpleString() for f in df.schema.fields]
        check(f"spark native={native}", r, m, (df.columns, spelled, got[i]))
    return len(reads), {n for df, _ in frames for n in df.columns}


def run_histories(count: int, url: Callable[[int], str], *,
                  few: bool = False) -> list[tuple[int, int, Shard, SchemaModel]]:
    """``count`` generated histories (shard at ``url(i)``), each checked through pyarrow, DuckDB
    and Polars (``few``: at fewer read times); returned with their :func:`variety` and order, for picking Spark's."""
    kept: list[tuple[int, int, Shard, SchemaModel]] = []
    names = itertools.count()

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def histories(data: st.DataObject) -> None:
        shard, model = build_history(data, url(next(names)))
        check_local_engines(shard, model, few=few)
        kept.append((variety(model), -len(kept), shard, model))

    histories()
    assert len(kept) >= count, kept
    return kept


def test_every_engine_reads_an_evolving_shard_as_the_model_under_both_schema_choices(spark: Any,
                                                                                     tmp_path: Path) -> None:
    kept = run_histories(HISTORIES, lambda i: (tmp_path / f"h{i}").as_uri())
    varied = sorted((k for k in kept if inner_change(k[3]) is not None), key=lambda k: k[:2], reverse=True)
    chosen = [(s, m) for _, _, s, m in varied[:SPARK_HISTORIES]]
    read = {n for _, _, _, m in kept for _, fields in m.history for _, n, _ in fields}
    assert set(NAMES) <= read and any(x.startswith("refused") for *_, m in kept for x in m.log), read
    assert len(chosen) == SPARK_HISTORIES and all(m.updates for _, m in chosen), [m.log for _, _, _, m in kept]
    checked, names = check_spark(spark, chosen)
    assert checked == 2 * 2 * SPARK_HISTORIES
    assert {"*", "a.b"} <= names, f"Spark read {names}: not the glob and the dot; reorder NAMES"


def test_on_s3_pyarrow_duckdb_and_polars_read_an_evolving_shard_as_the_model(moto: MotoServer) -> None:
    # Fewer histories and reads than on the local folder: every read is HTTP to moto (suite time).
    prefix = f"s3://shardsink-test/engines-{uuid.uuid4().hex[:8]}"  # tests/conftest.py BUCKET
    kept = run_histories(S3_HISTORIES, lambda i: f"{prefix}/h{i}", few=True)
    assert any(m.evolutions and m.updates for _, _, _, m in kept)
