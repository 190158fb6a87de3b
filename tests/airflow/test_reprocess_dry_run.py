"""Re-processing a sealed range with corrections, and read-only (dry-run) runs, with `airflow dags test`."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from af_helpers import DAY, START, Env, assert_no_leaks, ok

from shardsink import Shard
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import ShardNotFoundError
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev.dagrunner import dags_test
from shardsink_dev.synthetic import encode, generate

LEAN = {"SHARDSINK_WRITERS": "1", "SHARDSINK_CATCH_UP_AFTER_S": "0"}


def _run(af: Env, dag_id: str, logical_date: str, conf: dict[str, Any] | None = None,
         engine: dict[str, str] | None = None) -> str:
    return ok(dags_test({**af.env, **LEAN, **(engine or {})}, dag_id, logical_date, conf=conf, timeout=600))


def _rows(t: pa.Table, count: str | None = None) -> Counter[tuple[Any, ...]]:
    """User rows as a multiset (``count``: a multiplicity column, else each row once)."""
    users = [c for c in t.column_names if c not in (TIME, DIFF, COUNT)]
    out: Counter[tuple[Any, ...]] = Counter()
    for r in t.to_pylist():
        out[tuple(r[c] for c in users)] += r[count] if count else 1
    return +out


def _source(landing: str, lower: int, upper: int) -> Counter[tuple[Any, ...]]:
    src = LandingSource(landing)
    schema = src.schema()
    t = pa.concat_tables([read_landing_file(src.blob(), f, schema, "event_time") for f in src.files()])
    return _rows(t.filter(pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper))))


def _append_landing(af: Env, lower: int, upper: int) -> None:
    """The landing zone's rows in [lower, upper), appended to the shard (created if new) as one batch."""
    src = LandingSource(af.landing)
    schema = src.schema()
    t = pa.concat_tables([read_landing_file(src.blob(), f, schema, "event_time") for f in src.files()])
    t = t.filter(pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper)))
    t = t.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), t.num_rows))
    try:
        shard = Shard.open(af.shard_url)
    except ShardNotFoundError:
        shard = Shard.create(af.shard_url, schema, upper=lower)
    shard.append(t, lower=lower, upper=upper)


def _fix_day_one(landing: str) -> None:
    """Re-land day 1's first file: drop 3 rows, change 2, add 1 (the producer fixed its data)."""
    src = LandingSource(landing)
    f = next(f for f in src.files() if f.key.startswith("day=000/"))
    raw = read_landing_file(src.blob(), f, src.schema(), "event_time").to_pylist()
    rows = raw[3:]
    rows[0] = {**rows[0], "amount": rows[0]["amount"] + 1000}
    rows[1] = {**rows[1], "action": "refund"}
    rows.append({**rows[2], "user": "u999"})
    t = pa.Table.from_pylist([{"user": r["user"], "action": r["action"], "amount": r["amount"],
                               "event_time": r[TIME]} for r in rows])
    src.blob().put(f.key, encode(t, f.key.rsplit(".", 1)[-1]))


def _correction_parts(shard: Shard, lower: int, upper: int) -> list[Any]:
    return [p for b in shard.batches() for p in b.parts if p.corrected_range() == (lower, upper)]


@pytest.mark.timeout(1800)  # four dags-test runs, two Spark jobs each
def test_reprocessing_appends_exact_corrections_and_preserves_history(af: Env, connect_engine: dict[str, str]
                                                                     ) -> None:
    """Days 1-2 are committed by plain appends of their landing rows (two batches): every run
    below is a real ingest run with its re-processing; a first ingest ``dags test`` would only
    add an Airflow process and two JVMs. The first run's correction job is a spark-submit
    application, the later two are Spark Connect sessions (``SparkOptions(engine="connect")``):
    each engine's correction is checked against the landing zone."""
    generate(af.landing, start=START, days=6, files_per_day=2, rows_per_file=40)  # watermark: day 7
    _append_landing(af, START, START + DAY)
    _append_landing(af, START + DAY, START + 2 * DAY)
    shard = Shard.open(af.shard_url)
    assert shard.info().upper == START + 2 * DAY
    day1_old, day2 = _source(af.landing, START, START + DAY), _source(af.landing, START + DAY, START + 2 * DAY)
    _fix_day_one(af.landing)
    day1_new = _source(af.landing, START, START + DAY)
    assert day1_new != day1_old

    # 1. The changed day: its correction lands in the run's own description [day 3, day 4), at day 4 - 1.
    out = _run(af, "example_ingest", "2024-01-02", {"reprocess_from": "2024-01-01", "reprocess_to": "2024-01-02"})
    assert "with the correction of" in out and "Spark-Submit cmd" in out
    t1 = START + 3 * DAY - 1
    assert shard.info().upper == START + 3 * DAY
    assert _rows(shard.snapshot(t1), COUNT) == _source(af.landing, START, START + 3 * DAY)  # corrected
    assert _rows(shard.snapshot(t1 - 1), COUNT) == day1_old + day2 + _source(af.landing, START + 2 * DAY, t1)
    assert _rows(shard.changes(START, START + DAY), DIFF) == day1_old  # sealed updates are never rewritten
    at_t1 = _source(af.landing, t1, t1 + 1)  # day-3 rows that happen to be stamped at t1 (normally none)
    want = _signed_diff(day1_new, day1_old)
    assert _minus(_signed(shard.changes(t1, t1 + 1)), at_t1) == want  # exactly the correction
    assert sum(p.rows for p in _correction_parts(shard, START, START + DAY)) == len(want)

    # 2. An unchanged day: no correction rows, no correction bytes; only day 4's ordinary rows.
    out = _run(af, "example_ingest", "2024-01-03", {"reprocess_from": "2024-01-02", "reprocess_to": "2024-01-03"},
               engine=connect_engine)
    assert "over Spark Connect" in out and "Spark-Submit cmd" not in out
    assert shard.info().upper == START + 4 * DAY
    assert _correction_parts(shard, START + DAY, START + 2 * DAY) == []
    assert _rows(shard.snapshot(), COUNT) == _source(af.landing, START, START + 4 * DAY)

    # 3. The corrected day again: its earlier correction counts as the shard's holdings: 0 updates.
    n = len(_correction_parts(shard, START, START + DAY))
    _run(af, "example_ingest", "2024-01-02", {"reprocess_from": "2024-01-01", "reprocess_to": "2024-01-02"},
         engine=connect_engine)
    assert shard.info().upper == START + 5 * DAY
    assert len(_correction_parts(shard, START, START + DAY)) == n
    assert _rows(shard.snapshot(), COUNT) == _source(af.landing, START, START + 5 * DAY)
    assert_no_leaks(af.shard_url)


def _signed(t: pa.Table) -> Counter[tuple[Any, ...]]:
    users = [c for c in t.column_names if c not in (TIME, DIFF)]
    out: Counter[tuple[Any, ...]] = Counter()
    for r in t.to_pylist():
        out[tuple(r[c] for c in users)] += r[DIFF]
    return Counter({k: v for k, v in out.items() if v})


def _signed_diff(now: Counter[tuple[Any, ...]], old: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    return Counter({k: now[k] - old[k] for k in set(now) | set(old) if now[k] != old[k]})


def _minus(a: Counter[tuple[Any, ...]], b: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    out = Counter(a)
    for k, v in b.items():
        out[k] -= v
    return Counter({k: v for k, v in out.items() if v})


def _store(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _report(out: str) -> dict[str, Any]:
    line = next(x for x in out.splitlines() if "DRY RUN (nothing written): " in x)
    raw = line.split("DRY RUN (nothing written): ", 1)[1]
    return dict(json.JSONDecoder().raw_decode(raw.replace('\\"', '"'))[0])


@pytest.mark.timeout(1200)
def test_dry_runs_report_what_they_would_write_and_leave_the_store_byte_identical(
        af: Env, connect_engine: dict[str, str]) -> None:
    """Day 1 is committed for real by a plain append of its landing rows: the dry runs judge the
    shard's holdings, whoever committed them (a real ingest under re-processing is the test above),
    and an ingest ``dags test`` would only add an Airflow process and a JVM. The DAGs run over
    Spark Connect, so each dry run is a session of its server (a local session in the task:
    tests/airflow/test_evolving.py's add_columns dry run, tests/spark/test_dryrun.py)."""
    af.env["SHARDSINK_VIEW"] = (af.root / "shards" / "per_user_day").as_uri()
    generate(af.landing, start=START, days=3, files_per_day=2, rows_per_file=40)
    _append_landing(af, START, START + DAY)  # day 1, for real
    shards = af.root / "shards"
    before = _store(shards)

    out = _run(af, "example_ingest", "2024-01-04", {"dry_run": True}, engine=connect_engine)
    assert "dry run: computing what the run would write over Spark Connect (connection 'spark_connect_default')" \
        in out, out[-3000:]
    ingest = _report(out)
    assert ingest["updates"] == sum(_source(af.landing, START + DAY, START + 3 * DAY).values())
    assert ingest["bytes"] > 0 and ingest["lines"][0]["sample"]
    assert _store(shards) == before

    _fix_day_one(af.landing)
    redo = _report(_run(af, "example_ingest", "2024-01-02", {"dry_run": True, "reprocess_from": "2024-01-01",
                                                             "reprocess_to": "2024-01-02"}, engine=connect_engine))
    corr = next(x for x in redo["lines"] if x["what"] == "correction")
    assert (corr["inserts"], corr["retractions"]) == (3, 5), corr  # 2 changed + 1 new; 3 dropped + 2 changed
    assert corr["bytes"] > 0 and corr["sample"]
    assert _store(shards) == before

    view = _report(_run(af, "example_view", "2024-02-01", {"dry_run": True}, engine=connect_engine))
    assert view["updates"] > 0 and view["lines"][0]["what"] == "view correction"
    assert _store(shards) == before and not (shards / "per_user_day").exists()
