"""Faults around the view: a crash between the shard's commit and the view's, two writers of the
same snapshot, GC with an expired snapshot, the whole view deleted. The view may fall behind,
never be wrong; ``sync`` or the next commit catches it up."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

from shardsink import iceberg
from shardsink.core import after_commit
from shardsink.core.roots import RootObjects
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.iceberg import keeper as isync
from shardsink.iceberg import layout
from shardsink.iceberg.view import advance
from shardsink.maintenance.compact import compact_batches
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.since import advance_since
from tests.iceberg.judge import io_props
from tests.iceberg.test_histories import judge

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def rows(n: int, t: int) -> pa.Table:
    return pa.table({"k": [f"k{t}-{i}" for i in range(n)], "v": list(range(n)), "_time": [t] * n, "_diff": [1] * n})


def viewed(url: str, appends: int = 1) -> Shard:
    shard = Shard.create(url, SCHEMA)
    iceberg.enable(shard)
    for i in range(appends):
        shard.append(rows(2, 10 * i), lower=10 * i, upper=10 * i + 10)
    return shard


def view_seqno(shard: Shard) -> int | None:
    return iceberg.find(shard)


def test_a_crash_before_the_view_is_written_leaves_it_behind_then_sync_catches_up(
        shard_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = viewed(shard_url)
    before = view_seqno(shard)
    with monkeypatch.context() as m:
        m.setattr(isync, "advance", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
        out = shard.append(rows(1, 10), lower=10, upper=20)  # the commit stands; the hook's failure is logged
    assert out.seqno == before + 1 and view_seqno(shard) == before
    assert iceberg.sync(shard) == 1 and view_seqno(shard) == shard.reader().head().seqno  # sync catches up
    judge(shard)
    assert iceberg.sync(shard) == 0
    with monkeypatch.context() as m:
        m.setattr(isync, "advance", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
        shard.append(rows(1, 20), lower=20, upper=30)
    isync.forget()
    shard.append(rows(1, 30), lower=30, upper=40)  # so does the next commit (from a fresh process)
    assert view_seqno(shard) == shard.reader().head().seqno
    judge(shard)


def test_two_writers_of_the_same_snapshot_write_it_once(shard_url: str) -> None:
    shard = viewed(shard_url)
    roots = RootObjects(shard.url)
    v = shard.reader().head()
    prev = isync.load(roots, shard.url, v.seqno - 1)
    assert prev is not None
    _, writes = advance(shard.url, prev, v)
    assert dict(writes) == {k: roots.get(k) for k, _ in writes}  # the stored objects are exactly a rewrite's
    isync.forget()
    shard.append(rows(1, 10), lower=10, upper=20)
    for key in [k for k, _ in writes]:
        assert roots.create(key, b"x") is False  # a second writer's create is a no-op
    isync.forget()
    # two syncs racing from behind: both finish, the objects are written once
    roots_list = [o.key for o in roots.list(layout.METADATA)]
    for key in roots_list:
        if key.endswith(f"v{shard.reader().head().seqno}.metadata.json"):
            shard.admin().delete_registered([key])
    errors: list[BaseException] = []

    def one() -> None:
        try:
            iceberg.sync(Shard.open(shard.url))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    judge(shard)


def test_gc_keeps_what_a_retained_snapshot_references_until_since_expires_it(tmp_path: object) -> None:
    shard = viewed(f"file://{tmp_path}/s", appends=3)
    b = shard.batches()
    old = {p.key for x in b[:2] for p in x.parts}
    assert compact_batches(shard, b[:2], since=0).status == "applied"
    roots, head = RootObjects(shard.url), shard.reader().head()
    assert old <= isync.held(shard.url, head, roots)  # the snapshots before the compaction hold them
    collect(shard, GcOptions(grace_s=0, retention=1))
    assert old <= {o.key for o in shard.admin().list_parts()}
    judge(shard)
    shard.append(rows(1, 30), lower=30, upper=40)
    advance_since(shard, target=35)  # since passes their uppers (30 and below): those snapshots are expired
    table = StaticTable.from_metadata(iceberg.current_location(shard))
    assert all(int(s.summary["shardsink.upper"]) > 35 for s in table.metadata.snapshots)
    assert not old & isync.held(shard.url, shard.reader().head(), roots)
    collect(shard, GcOptions(grace_s=0, retention=1))
    judge(shard)


def test_gc_asks_the_view_and_keeps_the_parts_it_names(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = viewed(f"file://{tmp_path}/s")
    stray = shard.stage(rows(1, 10), lower=10, upper=20, desc_id="stray")  # staged, never committed
    shard.append(rows(1, 10), lower=10, upper=30)  # the upper passes it: it can never commit
    keys = {p.key for p in stray.parts}
    monkeypatch.setitem(after_commit._holders, layout.OPTION, lambda *_: frozenset(keys))
    collect(shard, GcOptions(grace_s=0))
    assert keys <= {o.key for o in shard.admin().list_parts()}  # the view names them: kept
    monkeypatch.setitem(after_commit._holders, layout.OPTION, lambda *_: (_ for _ in ()).throw(OSError("down")))
    report = collect(shard, GcOptions(grace_s=0))
    assert keys <= {o.key for o in shard.admin().list_parts()}  # the view's references unknown: kept
    assert "references are unknown" in str(report)
    monkeypatch.setitem(after_commit._holders, layout.OPTION, isync.held)
    collect(shard, GcOptions(grace_s=0))
    assert not keys & {o.key for o in shard.admin().list_parts()}


def test_the_whole_view_deleted_is_rebuilt_by_sync(shard_url: str) -> None:
    shard = viewed(shard_url, appends=2)
    roots = RootObjects(shard.url)
    shard.admin().delete_registered([o.key for o in roots.list(layout.TABLE + "/")])
    isync.forget()
    with pytest.raises(InvalidUsageError, match="no metadata"):
        iceberg.current_location(shard)
    assert iceberg.sync(shard) == 1
    loc = iceberg.current_location(shard)
    assert StaticTable.from_metadata(loc, properties=io_props(shard.url)).scan().to_arrow().num_rows == 4
    judge(shard)
    shard.admin().delete_registered([o.key for o in roots.list(layout.TABLE + "/")])
    isync.forget()
    shard.append(rows(1, 20), lower=20, upper=30)  # a commit with no view to continue from rebuilds it
    assert view_seqno(shard) == shard.reader().head().seqno
    judge(shard)


def test_verify_checks_the_view(tmp_path: object) -> None:
    from shardsink.maintenance.verify import verify

    shard = viewed(f"file://{tmp_path}/s", appends=2)
    assert verify(shard).ok
    roots = RootObjects(shard.url)
    seqno = shard.reader().head().seqno
    shard.admin().delete_registered([layout.list_key(seqno - 1)])  # an older snapshot's manifest list
    report = verify(shard)
    assert any("manifest list of snapshot" in p.message for p in report.problems), report.problems
    meta = StaticTable.from_metadata(iceberg.current_location(shard)).metadata
    assert meta.current_snapshot_id is not None
    # the newest snapshot listing other files than the shard's live parts is a problem too
    key = layout.metadata_key(seqno)
    data = roots.get(key)
    assert data is not None
    prev = isync.load(roots, shard.url, seqno - 2)
    assert prev is not None
    shard.admin().delete_registered([key])
    roots.put(key, isync.md.encode(prev.meta))  # a stale snapshot under the newest name
    assert any("they differ" in p.message for p in verify(shard).problems)


def test_gc_deletes_what_the_view_no_longer_needs_and_nothing_it_does(shard_url: str) -> None:
    from shardsink.maintenance.verify import verify

    shard = viewed(shard_url, appends=3)
    assert compact_batches(shard, shard.batches()[:2], since=0).status == "applied"
    shard.append(rows(1, 30), lower=30, upper=40)
    advance_since(shard, target=35)
    roots = RootObjects(shard.url)
    before = {o.key for o in roots.list(layout.METADATA)}
    collect(shard, GcOptions(grace_s=0))
    after = {o.key for o in roots.list(layout.METADATA)}
    gone = before - after
    head = shard.reader().head().seqno
    assert {layout.list_key(1), layout.list_key(2)} <= gone  # the manifest lists of expired snapshots
    assert any(k.startswith(f"{layout.METADATA}m-2-") for k in gone)  # a compacted batch's manifest
    assert {layout.metadata_key(head), layout.metadata_key(1), layout.list_key(head - 1)} <= after  # current, log
    judge(shard)
    assert verify(shard).ok
    collect(shard, GcOptions(grace_s=3600))  # within the grace period nothing goes
    assert {o.key for o in roots.list(layout.METADATA)} == after
