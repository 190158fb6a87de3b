"""The landed-file index and bounded-memory reads (no Spark): built from footers once, a cache that
survives crashes, stale entries and deletion, and reads that refuse a file changed since listing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shardsink import hooks
from shardsink.core.roots import RootObjects
from shardsink.core.updates import TIME
from shardsink.sources import LandingSource, MalformedInputError, Seal
from shardsink.sources.base import Sealing
from shardsink.sources.landing import read_landing_file
from shardsink.sources.landing.index import IndexEntry, get_plan, make_plan, refresh
from shardsink.sources.landing.index_store import FORMAT, FORMAT_V1, RING, LandingIndexDoc, load
from shardsink.sources.landing.layout import INDEX_KEY, delta_key
from shardsink.sources.landing.read import stream_rows
from shardsink.storage.retry import RetryingBlob
from shardsink_dev.synthetic import SCHEMA, land_file, landing_table

DAY = 86_400_000


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(landing root, shard url)."""
    if request.param == "local":
        return str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    request.getfixturevalue("moto")
    n = time.monotonic_ns()
    return f"s3://shardsink-test/landing-{n}", f"s3://shardsink-test/shard-{n}"


def _land_days(root: str, days: int, fmt: str = "parquet") -> None:
    for d in range(days):
        land_file(root, f"day{d}/a.{fmt}", landing_table(d * DAY, (d + 1) * DAY, 30, seed=d))


def _index(src: LandingSource, shard: str) -> dict[str, IndexEntry]:
    return refresh(src.blob(), shard, root=src.root, time_column=src.time_column, listing=src.files()).entries


def test_index_is_built_once_from_footers_and_plans_read_only_the_window(where: tuple[str, str]) -> None:
    root, shard = where
    _land_days(root, 4)
    land_file(root, "day1/b.csv", landing_table(DAY, 2 * DAY, 10, seed=9))
    src = LandingSource(root)
    blob = RetryingBlob(src.blob())
    entries = _index(src, shard)
    e = entries["day2/a.parquet"]
    t = read_landing_file(blob, next(f for f in src.files() if f.key == "day2/a.parquet"), SCHEMA, "event_time")
    assert (e.rows, e.tmin, e.tmax) == (30, pc.min(t[TIME]).as_py(), pc.max(t[TIME]).as_py())
    assert entries["day1/b.csv"].rows == 10 and entries["day1/b.csv"].fmt == "csv"
    before = blob.requests
    again = refresh(blob, shard, root=src.root, time_column="event_time", listing=src.files()).entries
    assert again == entries and blob.requests == before, "an unchanged zone reads no landed file again"
    land_file(root, "day9/a.parquet", landing_table(9 * DAY, 10 * DAY, 30, seed=9))
    seen = dict(blob.requests_by_kind)
    refresh(blob, shard, root=src.root, time_column="event_time", listing=src.files())
    new = {k: v - seen.get(k, 0) for k, v in blob.requests_by_kind.items() if v != seen.get(k, 0)}
    assert new == {("get_range", "day9"): 1}, "a new Parquet file: its footer only"
    listing = src.files()
    idx = refresh(blob, shard, root=src.root, time_column="event_time", listing=listing)
    plan = make_plan(idx, desc_id="d1", lower=2 * DAY, upper=3 * DAY, root=src.root, time_column="event_time",
                     listing=listing)
    assert [r.key for r in plan.read] == ["day2/a.parquet"]
    assert sorted(o.key for o in plan.older) == ["day0/a.parquet", "day1/a.parquet", "day1/b.csv"]


def test_index_faults_crash_while_written_garbage_deleted_and_stale_entries(tmp_path: Path) -> None:
    root, shard = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    _land_days(root, 2)
    src = LandingSource(root)
    store = RootObjects(shard)

    _index_killed_at_put(src, shard, "killed while writing the index")
    assert store.get(INDEX_KEY) is None, "a crash before the put leaves no index"
    good = _index(src, shard)
    store.put(INDEX_KEY, (store.get(INDEX_KEY) or b"")[:37])  # a torn document (a store without atomic puts)
    assert _index(src, shard) == good, "an unreadable index is rebuilt, never trusted"
    (tmp_path / "shard" / INDEX_KEY).unlink()  # deleted mid-life: a re-scan
    assert _index(src, shard) == good
    # Stale: the file was re-landed with other rows after it was indexed.
    path = Path(root) / "day0/a.parquet"
    land_file(root, "day0/a.parquet", landing_table(5 * DAY, 6 * DAY, 7, seed=3))
    os.utime(path, (path.stat().st_atime + 5, path.stat().st_mtime + 5))
    e = _index(src, shard)["day0/a.parquet"]
    assert (e.rows, e.tmin is not None and e.tmin >= 5 * DAY) == (7, True)
    assert e.first_seen == path.stat().st_mtime, "a re-landed file appeared when it was re-landed"


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_streamed_rows_equal_the_whole_read_and_prune_row_groups(tmp_path: Path, fmt: str) -> None:
    root = str(tmp_path)
    t = landing_table(0, 10 * DAY, 5_000, seed=1).sort_by("event_time")
    if fmt == "parquet":
        pq.write_table(t, tmp_path / "a.parquet", row_group_size=500)
    else:
        land_file(root, f"a.{fmt}", t)
    src = LandingSource(root)
    f = src.files()[0]
    window = (3 * DAY, 4 * DAY)
    whole = read_landing_file(src.blob(), f, SCHEMA, "event_time")
    want = whole.filter(pc.and_(pc.greater_equal(whole[TIME], window[0]), pc.less(whole[TIME], window[1])))
    blob = RetryingBlob(src.blob())
    blocks = list(stream_rows(blob, f, SCHEMA, "event_time", root=root, window=window))
    got = pa.concat_tables(blocks) if blocks else want.schema.empty_table()
    assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr) and want.num_rows > 0
    if fmt == "parquet":
        assert pq.ParquetFile(tmp_path / "a.parquet").metadata.num_row_groups == 10
        assert blob.requests <= 3, "the footer and the (at most 2) row groups holding the window, no others"


def test_a_file_changed_after_listing_is_refused_not_half_read(where: tuple[str, str]) -> None:
    root, _ = where
    land_file(root, "a.parquet", landing_table(0, DAY, 50, seed=1))
    src = LandingSource(root)
    f = src.files()[0]
    land_file(root, "a.parquet", landing_table(0, DAY, 60, seed=2))  # rewritten in place: other bytes, other size
    with pytest.raises(MalformedInputError, match="changed or disappeared since it was listed"):
        list(stream_rows(src.blob(), f, SCHEMA, "event_time", root=root, window=(0, DAY)))


def test_plans_are_for_their_description_only(tmp_path: Path) -> None:
    root, shard = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    _land_days(root, 2)
    src = LandingSource(root)
    src.prepare_chain(shard, [type("D", (), {"desc_id": "d-1", "lower": 0, "upper": DAY})()])
    assert get_plan(shard, desc_id="d-1", lower=0, upper=DAY, root=src.root, time_column="event_time") is not None
    assert get_plan(shard, desc_id="d-1", lower=0, upper=2 * DAY, root=src.root, time_column="event_time") is None
    assert get_plan(shard, desc_id="d-2", lower=0, upper=DAY, root=src.root, time_column="event_time") is None


def test_add_columns_schemas_from_the_index_equal_the_files(where: tuple[str, str]) -> None:
    root, shard = where
    _land_days(root, 2)
    for fmt in ("csv", "jsonl"):
        land_file(root, f"x/b.{fmt}", landing_table(0, DAY, 5, seed=4))
    src = LandingSource(root)
    read = [(w, s.to_string()) for w, s in src.file_schemas(SCHEMA)]
    indexed = [(w, s.to_string()) for w, s in src.file_schemas(SCHEMA, shard_url=shard)]
    # Each distinct schema once (a repeat cannot change the target nor fail first), named by its first file.
    assert set(indexed) <= set(read) and {s for _, s in indexed} == {s for _, s in read}
    assert [w for w, _ in indexed] == [next(w for w, s in read if s == s2) for _, s2 in indexed]
    # The add_columns step after the mint: from the mint's own plans (no second listing), so only
    # the files the chain reads: not an older one (its rows were sealed), whatever its columns.
    land_file(root, "old/z.parquet", landing_table(0, DAY, 5, seed=5).append_column("extra", pa.array([1] * 5)))
    src.prepare_chain(shard, [type("D", (), {"desc_id": "d-1", "lower": DAY, "upper": 2 * DAY})()])
    assert any("extra" in s.names for _, s in src.file_schemas(SCHEMA, shard_url=shard)), "the zone holds it"
    src.files = lambda **_: pytest.fail("the zone was listed a second time")  # type: ignore[method-assign]
    chain = [(w, s.to_string()) for w, s in src.file_schemas(SCHEMA, shard_url=shard, desc_id="d-1")]
    assert chain == [(f"{src.root}/day1/a.parquet", s) for _, s in indexed[:1]]


def test_index_updates_write_only_what_changed_and_consolidate(tmp_path: Path) -> None:
    """A run adds a delta of its new entries; every RING + 1 updates one rewrites the base; racing
    writers both land; a crash or a lost delta costs a re-index of those files, never a wrong entry."""
    root, shard = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    _land_days(root, 20)
    src, store = LandingSource(root), RootObjects(shard)
    puts: list[int] = []
    remove = hooks.register("landing.index_put", lambda **kw: puts.append(kw["entries"]))
    try:
        _index(src, shard)
        for d in range(20, 20 + RING + 2):
            land_file(root, f"day{d}/a.parquet", landing_table(d * DAY, (d + 1) * DAY, 30, seed=d))
            _index(src, shard)
    finally:
        remove()
    assert puts == [20, *[1] * RING, 20 + RING + 1, 1], "deltas of the new entries; the base once per RING + 1"
    full = _index(src, (tmp_path / "rebuilt").as_uri())

    def loaded() -> dict[str, IndexEntry]:
        return load(store, root=src.root, time_column="event_time").entries

    assert loaded() == full
    # Racing writers: each saw the same index; the loser re-reads and adds its entry as the next delta.
    for d in (40, 41):
        land_file(root, f"day{d}/a.parquet", landing_table(d * DAY, (d + 1) * DAY, 30, seed=d))
    listing = src.files()
    mine = [f for f in listing if f.key != "day41/a.parquet"]
    theirs = [f for f in listing if f.key != "day40/a.parquet"]
    raced: list[bool] = []

    def racer(**_: object) -> None:  # the other mint writes first, once
        if not raced:
            raced.append(True)
            refresh(src.blob(), shard, root=src.root, time_column="event_time", listing=theirs)

    remove = hooks.register("landing.index_put", racer)
    try:
        refresh(src.blob(), shard, root=src.root, time_column="event_time", listing=mine)
    finally:
        remove()
    assert loaded() == _index(src, (tmp_path / "rebuilt").as_uri())
    # A crash while a delta is written leaves the index as it was.
    before = loaded()
    land_file(root, "day42/a.parquet", landing_table(42 * DAY, 43 * DAY, 30, seed=42))

    _index_killed_at_put(src, shard, "killed while writing a delta")
    assert loaded() == before
    _index(src, shard)
    # A lost delta ends the chain: its files and later ones are indexed again, equal to before.
    last = load(store, root=src.root, time_column="event_time").last
    (tmp_path / "shard" / delta_key((last - 1) % RING)).unlink()  # day40's delta; day42's follows it
    blob = RetryingBlob(src.blob())
    again = refresh(blob, shard, root=src.root, time_column="event_time", listing=src.files()).entries
    assert again == _index(src, (tmp_path / "rebuilt").as_uri()) and blob.requests == 2
    # A /1 index (one document) is read, and rewritten as a /2 base by the next update.
    store.put(INDEX_KEY, msgspec.json.encode(LandingIndexDoc(format=FORMAT_V1, root=src.root, time_column="event_time",
                                                             entries=list(full.values()))))
    assert set(loaded()) == set(full)
    land_file(root, "day43/a.parquet", landing_table(43 * DAY, 44 * DAY, 30, seed=43))
    _index(src, shard)
    assert msgspec.json.decode(store.get(INDEX_KEY) or b"{}", type=dict)["format"] == FORMAT


def _index_killed_at_put(src: LandingSource, shard: str, why: str) -> None:
    """Index ``src`` with the index's put killed (hook ``landing.index_put``): the run raises."""
    def crash(**_: object) -> None:
        raise RuntimeError(why)

    remove = hooks.register("landing.index_put", crash)
    try:
        with pytest.raises(RuntimeError, match=why):
            _index(src, shard)
    finally:
        remove()


def test_a_file_judged_on_time_once_leaves_every_later_plan(tmp_path: Path) -> None:
    """Thirty days sealed by one listing each: the mint judges each listed file once, against the
    seal of its earliest time, and marks it in the index; a later plan's late check holds only the
    files not judged: a late one (refused by every run until moved out) and those of open days."""
    root, shard = str(tmp_path / "landing"), (tmp_path / "shard").as_uri()
    _land_days(root, 30)
    src = LandingSource(root)
    seals = [Seal(-(2**63), 0, 0, 0.0), Seal(0, 20 * DAY, 1, time.time() + 5)]  # days 0..19 sealed after landing
    land_file(root, "day3/late.parquet", landing_table(3 * DAY, 4 * DAY, 5, seed=9))
    os.utime(Path(root) / "day3/late.parquet", (time.time() + 10, time.time() + 10))  # after the sealing listing
    asked: list[int] = []
    sealing = Sealing(20 * DAY, lambda t: asked.append(t) or seals)
    src.prepare_chain(shard, [type("D", (), {"desc_id": "d-25", "lower": 25 * DAY, "upper": 26 * DAY})()],
                      sealing=sealing)
    assert len(asked) == 1 and asked[0] < DAY, "the seals are read once, back to the earliest time to judge"
    plan = get_plan(shard, desc_id="d-25", lower=25 * DAY, upper=26 * DAY, root=src.root, time_column="event_time")
    assert plan is not None
    older = sorted(o.key for o in plan.older)
    assert older == sorted(["day3/late.parquet", *[f"day{d}/a.parquet" for d in range(20, 25)]]), older
    judged = {k for k, e in load(RootObjects(shard), root=src.root, time_column="event_time").entries.items()
              if e.judged}
    assert judged == {f"day{d}/a.parquet" for d in range(20)}


class _SlowReads:
    """A blob whose every object read waits ``delay`` seconds (an S3 far away), counting the most
    reads in flight at once."""

    def __init__(self, blob: object, delay: float) -> None:
        import threading

        self._blob, self._delay, self._lock = blob, delay, threading.Lock()
        self.in_flight = self.most = 0

    def __getattr__(self, name: str) -> object:
        real = getattr(self._blob, name)
        if not name.startswith("get") or not callable(real):
            return real

        def slow(*a: object, **kw: object) -> object:
            with self._lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            try:
                time.sleep(self._delay)  # a slow store's latency, so reads overlap: what the test counts
                return real(*a, **kw)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return slow


def test_the_index_refresh_reads_new_files_concurrently_in_a_bounded_pool(tmp_path: Path) -> None:
    """16 new files, each read waiting 0.3 s: read at most INDEX_READERS at a time, not in turn."""
    from shardsink.sources.landing.index import INDEX_READERS

    root = str(tmp_path / "landing")
    for i in range(16):
        land_file(root, f"day0/f{i:02d}.parquet", landing_table(0, DAY, 5, seed=i))
    src = LandingSource(root)
    blob = _SlowReads(src.blob(), 0.3)
    t0 = time.monotonic()
    idx = refresh(blob, (tmp_path / "shard").as_uri(), root=src.root, time_column="event_time", listing=src.files())
    took = time.monotonic() - t0
    assert len(idx.entries) == 16 and all(e.rows == 5 for e in idx.entries.values())
    assert [k for k in idx.entries] == [f.key for f in src.files()]  # listing order kept
    assert 2 <= blob.most <= INDEX_READERS
    assert took < 16 * 0.3 / 2, f"{took:.1f} s: the files were read one after another"
