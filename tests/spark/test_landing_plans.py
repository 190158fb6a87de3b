"""Landing ingest from the mint's plan (the write job's path), on a local folder and on S3 (moto):
exactly once across days, only the window's files read, late files refused from the index, a
lost index re-scanned, and ``add_columns`` evolving from the index."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core.roots import RootObjects
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.evolve import evolve_for_source
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources import LandingSource, LateDataError, MalformedInputError
from shardsink.sources.landing import PlanMissingError
from shardsink.sources.landing.index import plan_key
from shardsink.sources.landing.layout import INDEX_KEY
from shardsink.spark.stage import stage_dataframe
from shardsink_dev.synthetic import DAY, SCHEMA, land_file, landing_table, publish_watermark

START = 0


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "local":
        return str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    n = time.monotonic_ns()
    return f"s3://shardsink-test/lp-landing-{n}", f"s3://shardsink-test/lp-shard-{n}"


def _mint(shard_url: str, src: LandingSource, end: int, *, tag: str = "", ahead_from: int | None = None
          ) -> Description:
    """One description to ``end`` (minted ahead from ``ahead_from``): the mint lists once and writes its plan."""
    shard = open_or_create(shard_url, src, initial_upper=START)
    out = mint_chain(shard, src, interval_end=end, max_span=None, max_chain=1, dag_id="lp", run_id=f"r{end}{tag}",
                     attempt=1, ahead_from=ahead_from)
    assert isinstance(out, list)
    return out[0]


def _write(spark: Any, shard_url: str, src: LandingSource, d: Description, *, slots: int = 2
           ) -> list[dict[str, Any]]:
    """Every slot's write job of ``d``, from its plan, as the write task runs it."""
    shard, inputs = Shard(shard_url), []
    head = shard.reader().head()
    for slot in range(slots):
        df, got = src.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots, schema=head.header.schema,
                                seals=seals(shard, head=head), shard_url=shard_url, desc_id=d.desc_id,
                                listed=d.listing is not None)
        parts = stage_dataframe(df, shard_url=shard_url, schema=head.header.schema, lower=d.lower, upper=d.upper,
                                desc_id=d.desc_id)
        write_manifest(shard, d, slot=slot, slots=slots, parts=parts, inputs=got)
        inputs += got
    return inputs


def _run(spark: Any, shard_url: str, src: LandingSource, end: int, *, slots: int = 2, tag: str = ""
         ) -> list[dict[str, Any]]:
    """mint (listing once, writing the plan) -> every slot's write job from the plan -> append."""
    d = _mint(shard_url, src, end, tag=tag)
    inputs = _write(spark, shard_url, src, d, slots=slots)
    append_from_manifests(Shard(shard_url), d, slots)
    return inputs


def _land_day(root: str, day: int, table: pa.Table | None = None) -> pa.Table:
    t = table if table is not None else landing_table(day * DAY, (day + 1) * DAY, 40, seed=day)
    land_file(root, f"dt={day}/a.parquet", t)
    land_file(root, f"dt={day}/b.csv", t.slice(0, 10))
    publish_watermark(root, (day + 1) * DAY)
    return t


def _rows(shard_url: str) -> Counter[tuple[Any, ...]]:
    s = Shard.open(shard_url)
    upper = s.info().upper
    assert upper is not None
    t = s.changes(0, upper)
    out: Counter[tuple[Any, ...]] = Counter()
    for r in t.to_pylist():
        out[(r["user"], r["action"], r["amount"], r["_time"])] += r["_diff"]
    return +out


def test_days_ingest_exactly_once_reading_only_their_files_and_late_files_are_refused(
        spark: Any, where: tuple[str, str]) -> None:
    root, shard_url = where
    src = LandingSource(root)
    want: Counter[tuple[Any, ...]] = Counter()
    for day in range(3):
        t = _land_day(root, day)
        want += Counter((r["user"], r["action"], r["amount"], r["event_time"])
                        for r in [*t.to_pylist(), *t.slice(0, 10).to_pylist()])
        inputs = _run(spark, shard_url, src, (day + 1) * DAY)
        assert sorted(i["key"] for i in inputs) == [f"dt={day}/a.parquet", f"dt={day}/b.csv"], \
            "a day's run reads its own files, not the history"
        if day == 1:
            RootObjects(shard_url).put(INDEX_KEY, b"{")  # a torn index: re-scanned, not trusted
    assert _rows(shard_url) == want
    # A file holding day-0 times lands after day 0 was sealed: refused from the index, naming it.
    land_file(root, "dt=0/late.parquet", landing_table(0, DAY, 5, seed=7))
    publish_watermark(root, 4 * DAY)
    with pytest.raises(LateDataError, match=r"late file .*dt=0/late\.parquet"):
        _run(spark, shard_url, src, 4 * DAY)
    assert _rows(shard_url) == want, "nothing of the refused run committed"


def test_add_columns_evolves_from_the_index(spark: Any, tmp_path: Path) -> None:
    root, shard_url = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    src = LandingSource(root)
    _land_day(root, 0)
    _run(spark, shard_url, src, DAY)
    t = landing_table(DAY, 2 * DAY, 10, seed=5)
    land_file(root, "dt=1/c.parquet", t.append_column("country", pa.array(["nl"] * 10)))
    publish_watermark(root, 2 * DAY)
    changes = evolve_for_source(Shard.open(shard_url), src, writer="t")
    assert [c.describe() for c in changes] and "country" in changes[0].describe()


def test_a_partitioned_zone_ingests_exactly_once_refusing_late_and_misplaced_files(
        spark: Any, where: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    root, shard_url = where
    src = LandingSource(root, schema=SCHEMA, partitions="dt=YYYY-MM-DD", lateness="1d")
    listed: list[str] = []
    blob = src.blob()

    later: dict[str, float] = {}  # key -> seconds its listing shows it landed later (S3: checked by ETag)

    class Counting:  # the landing blob, its LIST calls recorded
        def __getattr__(self, name: str) -> Any:
            return getattr(blob, name)

        def list(self, prefix: str) -> Any:
            listed.append(prefix)
            return (dataclasses.replace(o, modified=o.modified + later.get(o.key, 0.0)) for o in blob.list(prefix))

    monkeypatch.setattr(src, "blob", Counting)
    want: Counter[tuple[Any, ...]] = Counter()
    for day in range(3):
        t = landing_table(day * DAY, (day + 1) * DAY, 20, seed=day)
        land_file(root, f"dt=1970-01-0{day + 1}/a.parquet", t)
        publish_watermark(root, (day + 1) * DAY)
        want += Counter((r["user"], r["action"], r["amount"], r["event_time"]) for r in t.to_pylist())
        listed.clear()
        inputs = _run(spark, shard_url, src, (day + 1) * DAY)
        assert [i["key"] for i in inputs] == [f"dt=1970-01-0{day + 1}/a.parquet"]
        assert listed == [f"dt=1970-01-0{day}/" if day else "dt=1969-12-31/", f"dt=1970-01-0{day + 1}/"], \
            "the mint lists the run's day and the lateness horizon, the write slots list nothing"
    assert _rows(shard_url) == want
    # Day 4's folder holds a file with day 3's times: refused, naming it, before anything commits.
    land_file(root, "dt=1970-01-04/a.parquet", pa.concat_tables([landing_table(2 * DAY, 3 * DAY, 3, seed=8),
                                                                 landing_table(3 * DAY, 4 * DAY, 3, seed=9)]))
    publish_watermark(root, 4 * DAY)
    with pytest.raises(MalformedInputError, match=r"dt=1970-01-04/a\.parquet holds event times .* outside its day"):
        _run(spark, shard_url, src, 4 * DAY)
    # A late file within the horizon (day 3's folder, landed after day 3 was sealed): refused from the index.
    src.blob().delete("dt=1970-01-04/a.parquet")
    # S3's LastModified has whole seconds (and a local mtime the kernel's coarse clock): the late
    # file must appear later than the commit that sealed day 3 (a file landed within that second is
    # the documented clock hazard), so it is stamped two seconds on: its mtime, or S3's listing.
    land_file(root, "dt=1970-01-03/late.parquet", landing_table(2 * DAY, 3 * DAY, 5, seed=7))
    if root.startswith("s3://"):
        later["dt=1970-01-03/late.parquet"] = 2.0
    else:
        os.utime(Path(root) / "dt=1970-01-03/late.parquet", (time.time() + 2, time.time() + 2))
    with pytest.raises(LateDataError, match=r"late file .*dt=1970-01-03/late\.parquet"):
        _run(spark, shard_url, src, 4 * DAY, tag="b")
    assert _rows(shard_url) == want, "nothing of the refused runs committed"


# --- what a run listed is what it sealed (every zone below lands after the shard exists) -------------


def _want(*tables: pa.Table, lo: int = -(2**63), hi: int = 2**63) -> Counter[tuple[Any, ...]]:
    """The landing rows of ``tables`` with event times in ``[lo, hi)``, as :func:`_rows` counts them."""
    return Counter((r["user"], r["action"], r["amount"], r["event_time"]) for t in tables for r in t.to_pylist()
                   if lo <= r["event_time"] < hi)


def _day_files(t: pa.Table) -> tuple[pa.Table, pa.Table]:
    return t, t.slice(0, 10)  # what _land_day lands: a.parquet, and b.csv with its first ten rows


def test_a_backfill_minted_ahead_over_days_landed_after_the_shard_ingests_them_exactly_once(
        spark: Any, where: tuple[str, str]) -> None:
    """Days 1 and 2 are minted ahead and staged while day 0 is still open: the earlier days' files
    (landed after the shard was created, as any producer's are) hold times no commit has sealed,
    so they are nobody's late data; each day's run stages its own interval and commits in turn."""
    root, shard_url = where
    src = LandingSource(root, schema=SCHEMA)
    open_or_create(shard_url, src, initial_upper=START)
    want: Counter[tuple[Any, ...]] = Counter()
    for day in range(3):
        want += _want(*_day_files(_land_day(root, day)))
    ahead = [_mint(shard_url, src, (k + 1) * DAY, ahead_from=k * DAY) for k in (2, 1)]
    for d in ahead:
        assert d.listing is not None
        _write(spark, shard_url, src, d)
    first = _mint(shard_url, src, DAY)
    _write(spark, shard_url, src, first)
    for d in (first, *reversed(ahead)):
        assert append_from_manifests(Shard(shard_url), d, 2).status == "committed"
    assert _rows(shard_url) == want
    log = [c for _, c in Shard.open(shard_url).log(limit=10) if c.kind == "append"]
    assert all(c.listing is not None for c in log), "each commit records the listing that fixed its input"


def test_a_file_landing_between_a_runs_listing_and_its_commit_is_refused_by_the_next_run(
        spark: Any, where: tuple[str, str]) -> None:
    """Day 0's mint lists its zone; a file with 100 rows on day 0 and 50 on day 1 lands before day
    0's commit. Day 0 seals its times as of its listing, which did not hold the file: the day-1
    run refuses it, naming it, and commits nothing (it used to ingest the 50 and drop the 100)."""
    root, shard_url = where
    src = LandingSource(root, schema=SCHEMA)
    open_or_create(shard_url, src, initial_upper=START)
    want = _want(*_day_files(_land_day(root, 0)))
    d = _mint(shard_url, src, DAY)
    late = pa.concat_tables([landing_table(0, DAY, 100, seed=11), landing_table(DAY, 2 * DAY, 50, seed=12)])
    land_file(root, "dt=0/late.parquet", late)  # after the listing, before the write and the commit
    _write(spark, shard_url, src, d)
    append_from_manifests(Shard(shard_url), d, 2)
    assert _rows(shard_url) == want, "day 0 read what its mint listed"
    day1 = _land_day(root, 1)
    with pytest.raises(LateDataError, match=r"late file .*dt=0/late\.parquet.* sealed by commit seqno 1"):
        _run(spark, shard_url, src, 2 * DAY)
    assert _rows(shard_url) == want, "nothing of the refused run committed"
    src.blob().delete("dt=0/late.parquet")  # the operator moves it out (runbook): the run goes on
    _run(spark, shard_url, src, 2 * DAY, tag="b")
    assert _rows(shard_url) == want + _want(*_day_files(day1))


def test_files_landing_while_a_description_minted_ahead_waits_are_refused_never_dropped(
        spark: Any, where: tuple[str, str]) -> None:
    """Day 1 is minted ahead while day 0 waits. ``early`` (30 rows on day 0, 20 on day 1) lands
    after day 0's listing and before day 1's: day 1 ingests its 20, and day 0 never saw its 30.
    ``late`` (100 rows on day 1, 50 on day 2) lands after day 1's listing, before either commits.
    Each is late against the listing that sealed its earliest time: the day-2 run refuses each,
    naming it, until it is moved out; nothing is dropped silently."""
    root, shard_url = where
    src = LandingSource(root, schema=SCHEMA)
    open_or_create(shard_url, src, initial_upper=START)
    want = _want(*_day_files(_land_day(root, 0)), *_day_files(_land_day(root, 1)))
    d0 = _mint(shard_url, src, DAY)
    early = pa.concat_tables([landing_table(0, DAY, 30, seed=21), landing_table(DAY, 2 * DAY, 20, seed=22)])
    land_file(root, "dt=0/early.parquet", early)
    d1 = _mint(shard_url, src, 2 * DAY, ahead_from=DAY)
    _write(spark, shard_url, src, d1)  # day 0 is open: early's day-0 times are sealed by nobody yet
    late = pa.concat_tables([landing_table(DAY, 2 * DAY, 100, seed=23), landing_table(2 * DAY, 3 * DAY, 50, seed=24)])
    land_file(root, "dt=1/late.parquet", late)
    _write(spark, shard_url, src, d0)
    for d in (d0, d1):
        assert append_from_manifests(Shard(shard_url), d, 2).status == "committed"
    want += _want(early, lo=DAY, hi=2 * DAY)
    assert _rows(shard_url) == want
    day2 = _land_day(root, 2)
    refused = []
    for tag in "ab":
        with pytest.raises(LateDataError) as e:
            _run(spark, shard_url, src, 3 * DAY, tag=tag)
        key = next(k for k in ("dt=0/early.parquet", "dt=1/late.parquet") if k in str(e.value))
        refused.append(key)
        assert _rows(shard_url) == want, "nothing of a refused run committed"
        src.blob().delete(key)  # moved out by the operator
    assert sorted(refused) == ["dt=0/early.parquet", "dt=1/late.parquet"]
    _run(spark, shard_url, src, 3 * DAY, tag="c")
    assert _rows(shard_url) == want + _want(*_day_files(day2))


def test_a_plan_lives_while_its_description_may_commit_and_a_missing_one_is_an_error(
        spark: Any, tmp_path: Path) -> None:
    """GC past the grace period keeps a StillPossible description's plan: its slot retried then
    reads the files its mint listed, not a file landed since. Once committed, GC deletes it.
    A plan deleted by hand is an error naming the description, never a second listing."""
    root, shard_url = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    src = LandingSource(root, schema=SCHEMA)
    open_or_create(shard_url, src, initial_upper=START)
    _land_day(root, 0)
    d = _mint(shard_url, src, DAY)
    days_on = GcOptions(grace_s=0, clock=lambda: time.time() + 10 * 86_400)
    collect(Shard(shard_url), days_on)
    assert RootObjects(shard_url).get(plan_key(d.desc_id)) is not None, "StillPossible: its plan is kept"
    land_file(root, "dt=0/after.parquet", landing_table(0, DAY, 5, seed=31))
    inputs = _write(spark, shard_url, src, d)
    assert sorted(i["key"] for i in inputs) == ["dt=0/a.parquet", "dt=0/b.csv"], "the listed files, no others"
    append_from_manifests(Shard(shard_url), d, 2)
    assert collect(Shard(shard_url), days_on).plans_deleted >= 2  # the plan and its schemas: fate final
    assert RootObjects(shard_url).get(plan_key(d.desc_id)) is None
    src.blob().delete("dt=0/after.parquet")
    _land_day(root, 1)
    d1 = _mint(shard_url, src, 2 * DAY)
    Shard(shard_url).admin().delete_registered([plan_key(d1.desc_id)])
    with pytest.raises(PlanMissingError, match=rf"description {d1.desc_id} .* no readable file plan"):
        _write(spark, shard_url, src, d1)
