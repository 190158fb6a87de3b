"""The view DAG end to end: real `airflow dags test`, the view's write job a real spark-submit at
local[2] or (the S3 test) a session of the test run's Spark Connect server, the repo's
dags/example_view.py over the example ingest shard (local folder and moto S3)."""

from __future__ import annotations

import subprocess
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from af_helpers import (
    DAY,
    START,
    VENV_BIN,
    Env,
    assert_no_leaks,
    lineage_env,
    lineage_events,
    ok,
    read_lineage,
    source_updates,
)

from shardsink import Shard
from shardsink.errors import ShardNotFoundError
from shardsink.provider.lineage import shard_dataset
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev.dagrunner import dags_test
from shardsink_dev.synthetic import generate

VIEW_DAG = "example_view"


def _view_url(af: Env) -> str:
    return af.env["SHARDSINK_VIEW"]


def _with_view(af: Env) -> Env:
    af.env["SHARDSINK_VIEW"] = (af.root / "shards" / "per_user_day").as_uri()
    return af


def _dags_test(af: Env, dag_id: str, logical_date: str) -> subprocess.CompletedProcess[str]:
    return dags_test(af.env, dag_id, logical_date)


def _day(t: int) -> date:
    return datetime.fromtimestamp(t / 1000, tz=UTC).date()


def _expected_from_updates(rows: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """events per (user, UTC day of _time) from (user, action, amount, _time, diff) updates."""
    per: Counter[tuple[str, date]] = Counter()
    for user, _action, _amount, t, diff in rows:
        per[(user, _day(t))] += diff
    return Counter({(u, d, n): 1 for (u, d), n in per.items() if n})


def _view(url: str, as_of: int | None = None) -> Counter[tuple[Any, ...]]:
    snap = Shard.open(url).snapshot(as_of)
    return Counter({(r["user"], r["day"], r["events"]): r["_count"] for r in snap.to_pylist()})


# The view DAG file's import and its schedule on the ingest shard's asset: test_ingest_e2e.py's
# DagBag test (one Airflow import for every DAG file).


def test_one_view_run_covers_coalesced_ingest_batches_reports_lineage_and_rerun_is_a_noop(
        af: Env, connect_engine: dict[str, str]) -> None:
    """Two ingest batches then ONE view run: it processes everything available and reports its
    lineage (OpenLineage file transport on the view run).

    Day 1 is a real ingest run (the view reads parts the Spark ingest wrote, over Spark Connect:
    the view's own job is a spark-submit); day 2 is a plain append of the landing's rows: what the
    view must coalesce is batches, and a second ingest ``dags test`` only adds an Airflow process."""
    _with_view(af)
    af.env["SHARDSINK_WRITERS"] = "1"
    generate(af.landing, start=START, days=2, files_per_day=2, rows_per_file=120)
    ok(af.dags_test("2024-01-02", extra=connect_engine))
    assert len(af.asset_events()) == 1
    _append_landing(af, START + DAY, START + 2 * DAY)
    assert Shard.open(af.shard_url).info().seqno == 2
    lineage_file = af.home / "view-lineage.jsonl"
    af.env.update(lineage_env(lineage_file))
    out = ok(_dags_test(af, VIEW_DAG, "2024-02-01"))
    lineage = read_lineage(lineage_file)
    assert "Spark-Submit cmd" in out
    view = Shard.open(_view_url(af))
    info = view.info()
    assert (info.seqno, info.upper) == (1, START + 2 * DAY)  # one batch: both ingest batches at once
    assert [f.name for f in view.schema] == ["user", "day", "events"]
    assert view.schema.field("day").type == pa.date32()
    want = _expected_from_updates(source_updates(af.landing, START, START + 2 * DAY))
    assert _view(_view_url(af)) == want and len(want) > 50
    assert_no_leaks(_view_url(af))
    events = af.asset_events()  # the view's own asset event (views can be chained)
    assert events[-1]["shard"] == view.url and events[-1]["upper"] == START + 2 * DAY
    _assert_view_lineage(lineage, input_url=af.shard_url, view=view)

    again = ok(_dags_test(af, VIEW_DAG, "2024-02-01"))
    assert "nothing to do: no input has advanced past the view's upper" in again
    assert "Spark-Submit cmd" not in again
    assert view.info().seqno == 1


def _append_landing(af: Env, lower: int, upper: int) -> None:
    """The landing zone's rows in [lower, upper), appended to the ingest shard as one batch."""
    src = LandingSource(af.landing)
    t = pa.concat_tables([read_landing_file(src.blob(), f, src.schema(), "event_time") for f in src.files()])
    t = t.filter(pc.and_(pc.greater_equal(t["_time"], lower), pc.less(t["_time"], upper)))
    Shard.open(af.shard_url).append(t.append_column("_diff", pa.repeat(pa.scalar(1, pa.int64()), t.num_rows)),
                                    lower=lower, upper=upper)


def _assert_view_lineage(events: list[dict[str, Any]], *, input_url: str, view: Shard) -> None:
    """Every task of the view run's attempt names the input shard → the view shard; once the
    view shard exists (the write creates it) the output carries its schema, and append's
    completion the rows and bytes it committed."""
    src, out = shard_dataset(input_url), shard_dataset(view.url)
    for task in ("mint", "write", "append"):
        mine = lineage_events(events, f"{VIEW_DAG}.attempt_1.{task}")
        assert {e["eventType"] for e in mine} >= {"START", "COMPLETE"}, (task, [e["eventType"] for e in mine])
        for e in mine:
            assert [(i["namespace"], i["name"]) for i in e["inputs"]] == [(src.namespace, src.name)], task
            assert [(o["namespace"], o["name"]) for o in e["outputs"]] == [(out.namespace, out.name)], task
    created = [e for t in ("write", "append") for e in lineage_events(events, f"{VIEW_DAG}.attempt_1.{t}")
               if t == "append" or e["eventType"] == "COMPLETE"]
    for e in created:
        assert [f["name"] for f in e["outputs"][0]["facets"]["schema"]["fields"]] == ["user", "day", "events"], e
    [done] = [e for e in lineage_events(events, f"{VIEW_DAG}.attempt_1.append") if e["eventType"] == "COMPLETE"]
    stats = done["outputs"][0]["outputFacets"]["outputStatistics"]
    [batch] = view.batches()
    assert (stats["rowCount"], stats["size"]) == (batch.rows, batch.bytes) and batch.rows > 50


def _cli(af: Env, *args: str) -> str:
    return ok(subprocess.run([str(VENV_BIN / "shardsink"), *args], env=af.env, capture_output=True, text=True,
                             timeout=60))


def _append_events(shard: Shard, rows: list[tuple[str, str, int, int, int]], lower: int, upper: int) -> None:
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], [], []]
    shard.append(pa.table({"user": pa.array(cols[0], pa.string()), "action": pa.array(cols[1], pa.string()),
                           "amount": pa.array(cols[2], pa.int64()), "_time": pa.array(cols[3], pa.int64()),
                           "_diff": pa.array(cols[4], pa.int64())}), lower=lower, upper=upper)


def test_s3_unchanged_rerun_writes_nothing_then_changes_and_a_foreign_append_are_corrected(
        af: Env, moto: object, tmp_path: Path, connect_engine: dict[str, str]) -> None:
    """On S3, the view's write jobs as sessions of the Connect server (``SHARDSINK_ENGINE=connect``):
    a first run, an unchanged rerun that writes no part, then new input and a foreign row appended
    to the view by hand, corrected to exactly the changed rows."""
    from shardsink_dev.testing import MotoServer

    assert isinstance(moto, MotoServer)
    moto.make_bucket("e2e-view")
    af.env.update(moto.env())
    af.env.update(connect_engine)
    af.env["SHARDSINK_SHARD"] = "s3://e2e-view/shards/events"
    af.env["SHARDSINK_VIEW"] = "s3://e2e-view/shards/per_user_day"
    schema = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])
    src = Shard.create(af.shard_url, schema, upper=START)
    day1 = [("a", "buy", 1, START + 5, 1), ("a", "view", 2, START + 6, 1), ("b", "buy", 3, START + 7, 1),
            ("c", "view", 4, START + 8, 1)]
    _append_events(src, day1, START, START + DAY)
    out = ok(_dags_test(af, VIEW_DAG, "2024-02-01"))
    assert "over Spark Connect (connection 'spark_connect_default')" in out and "Spark-Submit cmd" not in out
    view = Shard.open(_view_url(af))
    d1 = _day(START)
    assert _view(view.url) == Counter({("a", d1, 2): 1, ("b", d1, 1): 1, ("c", d1, 1): 1})

    _append_events(src, [], START + DAY, START + 2 * DAY)  # time passes, the view does not change
    ok(_dags_test(af, VIEW_DAG, "2024-02-01"))
    seqno, commit = view.log(limit=1)[0]
    assert (seqno, commit.lower, commit.upper, commit.rows) == (2, START + DAY, START + 2 * DAY, 0)
    assert not list(view._machine.blob.list(f"parts/{commit.desc_id}/")), "an unchanged rerun wrote part bytes"

    junk = tmp_path / "junk.csv"  # someone appends wrong rows to the view by hand
    junk.write_text(f"user,day,events,_time,_diff\nzz,{d1},7,{START + 2 * DAY},1\nb,{d1},1,{START + 2 * DAY},-1\n")
    _cli(af, "append", view.url, "--lower", str(START + 2 * DAY), "--upper", str(START + 2 * DAY + 1),
         "--input", str(junk))
    # New input on day 3: 'a' again, 'd' for the first time.
    d3 = _day(START + 2 * DAY)
    _append_events(src, [("a", "buy", 9, START + 2 * DAY + 1, 1), ("d", "click", 1, START + 2 * DAY + 10, 1)],
                   START + 2 * DAY, START + 3 * DAY)
    ok(_dags_test(af, VIEW_DAG, "2024-02-01"))
    assert _view(view.url) == Counter({("a", d1, 2): 1, ("b", d1, 1): 1, ("c", d1, 1): 1, ("a", d3, 1): 1,
                                       ("d", d3, 1): 1})
    got = {(r["user"], r["day"], r["events"]): r["_diff"] for r in view.changes(START + 2 * DAY + 1,
                                                                               START + 3 * DAY).to_pylist()}
    # exactly the changed rows: the foreign row retracted, the retracted right row restored, day 3 added
    assert got == {("zz", d1, 7): -1, ("b", d1, 1): 1, ("a", d3, 1): 1, ("d", d3, 1): 1}
    last = START + 3 * DAY - 1
    assert all(r["_time"] == last for r in view.changes(START + 2 * DAY + 1, START + 3 * DAY).to_pylist())
    assert_no_leaks(view.url)


BAD_DAGS = '''
import os
from datetime import UTC, datetime, timedelta
from shardsink.airflow import SparkOptions
from shardsink.airflow.view_factory import view_dag
from shardsink.sinks.materialize import ViewInput, view

common = dict(output_url={out!r}, task_retries=0, max_attempts=1, task_retry_delay=timedelta(seconds=1),
              start_date=datetime(2024, 1, 1, tzinfo=UTC), spark=SparkOptions(engine="connect"))
view_dag(dag_id="changed_view", schedule=None, view=view(
    inputs={{"events": ViewInput({src!r}, mode="updates")}},
    sql="SELECT user, to_date(timestamp_millis(_time)) AS day, count(*) * 1.0 AS events, 1 AS extra "
        "FROM events GROUP BY 1, 2"), **common)
view_dag(dag_id="ghost_view", schedule=None, view=view(
    inputs={{"events": {src!r}, "ghost": {ghost!r}}}, sql="SELECT * FROM events"), **common)
view_dag(dag_id="growing_view", schedule=None, view=view(
    inputs={{"events": ViewInput({src!r}, mode="updates")}},
    sql="SELECT user, to_date(timestamp_millis(_time)) AS day, sum(_diff) AS events" + os.environ.get("GROWN", "")
        + " FROM events GROUP BY 1, 2 HAVING sum(_diff) <> 0"), **common)
'''


def test_schema_change_and_missing_input_fail_clearly_output_unchanged_and_a_gained_column_evolves_it(
        af: Env, tmp_path: Path, connect_engine: dict[str, str]) -> None:
    """A query whose column changes type, and one over a missing input, fail their runs clearly
    with the output unchanged; then a view whose SQL gains a column between two runs evolves
    its output and corrects every row (issue 19). The views' write jobs are Connect sessions."""
    _with_view(af)
    af.env.update(connect_engine)
    schema = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])
    src = Shard.create(af.shard_url, schema, upper=START)
    _append_events(src, [("a", "buy", 1, START + 5, 1)], START, START + DAY)
    out_schema = pa.schema([("user", pa.string()), ("day", pa.date32()), ("events", pa.int64())])
    view = Shard.create(_view_url(af), out_schema, upper=START)  # the view's schema, fixed at creation
    dags = tmp_path / "dags"
    dags.mkdir()
    ghost = (tmp_path / "no-such-shard").as_uri()
    (dags / "bad_views.py").write_text(BAD_DAGS.format(out=view.url, src=src.url, ghost=ghost))
    af.env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)

    r = _dags_test(af, "changed_view", "2024-02-01")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "InvalidUsageError: the view query's output does not fit output shard" in out
    assert "column 'events' changed from int64 to decimal128(" in out and "which is not a widening" in out
    assert f"`shardsink schema {view.url} --drop events`" in out  # 'extra' alone would have been added
    assert "invalid input, not retried: InvalidUsageError:" in out
    assert out.count("over Spark Connect (connection") == 1, "an invalid view was retried"

    r = _dags_test(af, "ghost_view", "2024-02-01")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"view input 'ghost' names no shard: {ghost}" in out
    assert "over Spark Connect (connection" not in out
    info = view.info()
    assert (info.seqno, info.upper) == (0, START) and not list(view._machine.blob.list("parts/"))
    try:
        Shard.open(ghost)
        raise AssertionError("the missing input was created")
    except ShardNotFoundError:
        pass

    af.env["GROWN"] = ""  # run 1: (user, day, events), the output's schema
    ok(_dags_test(af, "growing_view", "2024-02-01"))
    day2 = [("a", "buy", 4, START + DAY + 5, 1), ("b", "view", 2, START + DAY + 6, 1)]
    _append_events(src, day2, START + DAY, START + 2 * DAY)
    af.env["GROWN"] = ", sum(amount * _diff) AS spent"  # run 2: the SQL gains a column
    ok(_dags_test(af, "growing_view", "2024-02-01"))
    assert view.schema.names == ["user", "day", "events", "spent"] and view.schema.field("spent").type == pa.int64()
    assert [e.id for e in view.schema_history()] == [0, 1]
    assert [(c.kind, getattr(c, "change", None)) for _, c in view.log(limit=3)] == [
        ("append", None), ("schema", "add spent:int64"), ("append", None)]
    per: Counter[tuple[str, date]] = Counter()
    spent: Counter[tuple[str, date]] = Counter()
    for user, _action, amount, t, diff in [("a", "buy", 1, START + 5, 1), *day2]:  # every input update
        per[(user, _day(t))] += diff
        spent[(user, _day(t))] += amount * diff
    snap = view.snapshot()
    assert Counter({(r["user"], r["day"], r["events"], r["spent"]): r["_count"] for r in snap.to_pylist()}) == \
        Counter({(u, d, n, spent[(u, d)]): 1 for (u, d), n in per.items()})
    d1 = _day(START)  # a full comparison: run 1's row, read with spent NULL, retracted and re-inserted
    assert {(r["user"], r["day"], r["events"], r["spent"]): r["_diff"] for r in view.changes(
        START + DAY, START + 2 * DAY).to_pylist() if r["day"] == d1} == {("a", d1, 1, None): -1, ("a", d1, 1, 1): 1}
    assert_no_leaks(view.url)
