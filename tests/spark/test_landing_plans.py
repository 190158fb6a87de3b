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
from shardsink.sinks.evolve import evolve_for_source
from shardsink.sinks.ingest import append_from_manifests, mint_chain, open_or_create
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources import LandingSource, LateDataError, MalformedInputError
from shardsink.sources.landing_layout import INDEX_KEY
from shardsink.spark.stage import stage_dataframe
from shardsink_dev.synthetic import DAY, SCHEMA, land_file, landing_table, publish_watermark

START = 0


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "local":
        return str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    n = time.monotonic_ns()
    return f"s3://shardsink-test/lp-landing-{n}", f"s3://shardsink-test/lp-shard-{n}"


def _run(spark: Any, shard_url: str, src: LandingSource, end: int, *, slots: int = 2, tag: str = ""
         ) -> list[dict[str, Any]]:
    """mint (listing once, writing the plan) -> every slot's write job from the plan -> append."""
    shard = open_or_create(shard_url, src, initial_upper=START)
    out = mint_chain(shard, src, interval_end=end, max_span=None, max_chain=1, dag_id="lp", run_id=f"r{end}{tag}",
                     attempt=1)
    assert isinstance(out, list)
    d, inputs = out[0], []
    head = shard.reader().head()
    for slot in range(slots):
        df, got = src.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots, schema=head.header.schema,
                                seals=seals(shard, head=head), shard_url=shard_url, desc_id=d.desc_id)
        parts = stage_dataframe(df, shard_url=shard_url, schema=head.header.schema, lower=d.lower, upper=d.upper,
                                desc_id=d.desc_id)
        write_manifest(shard, d, slot=slot, slots=slots, parts=parts, inputs=got)
        inputs += got
    append_from_manifests(shard, d, slots)
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
