"""Keeping the view current: after each commit (:func:`upkeep`), on demand (:func:`sync`), and
turning it on (:func:`enable`).

The view is derived, never in the way: shardsink never reads it for correctness, and every
object is created with the store's conditional create under a name derived from the shard
version, so two writers of the same version write the same objects once (the second is a no-op)
and a crash between the shard's commit and the view's leaves the view behind, never wrong.

:func:`upkeep` runs in the committing process (core's after-commit hook, by default on a background
worker: :mod:`shardsink.iceberg.background`): from the view of the
previous version, held in memory by the process that wrote or read it last, it creates the new
batches' manifests, the manifest list and the metadata (at most 3 requests); without that view
in memory it reads it first (2 more); without a view of the previous version (a crash, or a
commit by a process that could not keep the view) it catches up as :func:`sync` does. The hint
is written by :func:`sync` and by every :data:`HINT_EVERY`-th upkeep: it is a hint only.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from shardsink.core.after_commit import Committed
from shardsink.core.commits import OptionCommit
from shardsink.core.roots import RootObjects
from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.iceberg import layout
from shardsink.iceberg import metadata as md
from shardsink.iceberg.avro_files import ManifestRef, read_list, read_manifest_paths
from shardsink.iceberg.schema_map import check_mappable
from shardsink.iceberg.view import View, Writes, advance, start

log = logging.getLogger("shardsink.iceberg")
#: An upkeep writes the hint when the new seqno is a multiple of this.
HINT_EVERY = 32
#: How far below the shard's head :func:`find` looks for the newest metadata file.
PROBE_MAX = 256
_lock = threading.Lock()
_views: OrderedDict[str, View] = OrderedDict()  # url -> the newest view this process wrote or read


def _remember(url: str, view: View) -> None:
    with _lock:
        _views[url] = view
        _views.move_to_end(url)
        while len(_views) > 64:
            _views.popitem(last=False)


def _cached(url: str, seqno: int) -> View | None:
    with _lock:
        v = _views.get(url)
    return v if v is not None and v.seqno == seqno else None


def forget(url: str | None = None) -> None:
    """Drop the in-memory views (of ``url``; None: all). Tests and benches use it."""
    with _lock:
        if url is None:
            _views.clear()
        else:
            _views.pop(url, None)


def load(roots: RootObjects, url: str, seqno: int) -> View | None:
    """The view of shard version ``seqno`` from the store (None: no metadata file for it)."""
    key = layout.metadata_key(seqno)
    data = roots.get(key)
    if data is None:
        return None
    meta = md.decode(data, where=roots.where(key))
    snap = meta.current()
    refs: tuple[ManifestRef, ...] = ()
    if snap is not None:
        lst = roots.get(layout.list_key(layout.seqno_of_snapshot(snap.snapshot_id)))
        if lst is None:
            return None
        refs = tuple(r for r in read_list(url, lst) if r.added)
    return View(seqno, meta, refs)


def _write(roots: RootObjects, writes: Writes) -> bool:
    """Create every object, the metadata file last, once the others exist (the manifests and the
    manifest list concurrently: two round trips); False if the metadata file already existed."""
    *first, (key, data) = writes
    if len(first) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(first))) as pool:
            list(pool.map(lambda w: roots.create(*w), first))
    elif first:
        roots.create(*first[0])
    return roots.create(key, data)


def upkeep(c: Committed) -> None:
    """The view of the version just committed (run by :mod:`shardsink.iceberg.background`, in the
    committing call or on its worker): from the view of the previous version, else a catch-up."""
    v = c.version
    if v.header.option(layout.OPTION) != layout.ON or (isinstance(v.commit, OptionCommit)
                                                      and v.commit.name == layout.OPTION):
        return  # not on, or just turned on or off: enable() writes the first view itself
    view = _cached(c.url, v.seqno - 1) or load(c.roots, c.url, v.seqno - 1)
    if view is None:  # behind (a crash, a commit by a process without this package): catch up
        log.info("%s: no Iceberg view of seqno %d; catching up", c.url, v.seqno - 1)
        sync(Shard(c.url))
        return
    nxt, writes = advance(c.url, view, v)
    if _write(c.roots, writes):
        _remember(c.url, nxt)
    else:
        forget(c.url)
    if v.seqno % HINT_EVERY == 0:
        c.roots.put(layout.HINT, str(v.seqno).encode())


def _roots(shard: Shard) -> RootObjects:
    return RootObjects(shard.url)


def find(shard: Shard, head_seqno: int | None = None) -> int | None:
    """The seqno of the newest metadata file at or below the shard's head (None: no view)."""
    return newest(_roots(shard), shard.reader().head().seqno if head_seqno is None else head_seqno)


def newest(roots: RootObjects, n: int) -> int | None:
    """The seqno of the newest metadata file at or below seqno ``n``: probed downwards from ``n``,
    then (after :data:`PROBE_MAX` misses) from one listing of the metadata folder."""
    for s in range(n, max(-1, n - PROBE_MAX), -1):
        if roots.fetch(layout.metadata_key(s)) is not None:
            return s
    seqnos = [k for o in roots.list(layout.METADATA) if (k := layout.seqno_of_metadata(o.key)) is not None]
    return max((k for k in seqnos if k <= n), default=None)


def _require_on(shard: Shard) -> None:
    if shard.reader().head().header.option(layout.OPTION) != layout.ON:
        raise InvalidUsageError(f"{shard.url} has no Iceberg view: turn it on with `shardsink iceberg enable "
                                f"{shard.url}`", value=shard.url)


def sync(shard: Shard) -> int:
    """Bring the view up to the shard's head from any state, idempotently; returns the versions
    written. From the newest metadata file found, each later version in turn; with none (or the
    versions after it gone to GC), a fresh view of the head."""
    _require_on(shard)
    roots, reader = _roots(shard), shard.reader()
    head = reader.head()
    m = find(shard, head.seqno)
    view = load(roots, shard.url, m) if m is not None else None
    versions = reader.versions(range(view.seqno + 1, head.seqno + 1)) if view is not None else []
    if view is None or len(versions) != head.seqno - view.seqno:
        view, writes = start(shard.url, head.header, reader.batches(head), head.commit.at)
        _write(roots, writes)
        written = 1
    else:
        written = 0
        for v in versions:
            view, writes = advance(shard.url, view, v)
            _write(roots, writes)
            written += 1
    _remember(shard.url, view)
    roots.put(layout.HINT, str(view.seqno).encode())
    return written


def enable(shard: Shard, *, writer: str | None = None) -> int:
    """Turn the view on (the shard option, committed) and write the first snapshot from the current
    state; returns the seqno the view is at. InvalidUsageError (nothing written) for a column type
    the view cannot map."""
    from shardsink.core.commands import OptionCommand

    check_mappable(shard.reader().head().header)
    shard.admin().commit(OptionCommand(layout.OPTION, layout.ON), writer=writer)
    sync(shard)
    found = find(shard)
    assert found is not None
    return found


def current_location(shard: Shard) -> str:
    """The full location of the newest metadata file; InvalidUsageError when there is no view."""
    _require_on(shard)
    m = find(shard)
    if m is None:
        raise InvalidUsageError(f"{shard.url}: the Iceberg view has no metadata yet; run `shardsink iceberg sync "
                                f"{shard.url}`", value=shard.url)
    return layout.location(shard.url, layout.metadata_key(m))


def snapshot_as_of(shard: Shard, time: int) -> md.Snapshot | None:
    """The earliest retained snapshot holding every update at or before shard time ``time`` (its
    upper is past ``time``); read it filtered to ``_time <= time``. None: no snapshot holds it."""
    m = find(shard)
    view = None if m is None else load(_roots(shard), shard.url, m)
    if view is None:
        return None
    return next((s for s in sorted(view.meta.snapshots, key=lambda s: s.sequence_number)
                 if (u := s.upper()) is None or u > time), None)


def held(url: str, head: Version, roots: RootObjects) -> frozenset[str]:
    """GC's part holder: every part a retained snapshot of the newest view references (none
    without a view). CorruptionError if a retained snapshot's manifest list or manifest is missing."""
    m = newest(roots, head.seqno)
    data = None if m is None else roots.get(layout.metadata_key(m))
    if m is None or data is None:
        return frozenset()
    meta = md.decode(data, where=roots.where(layout.metadata_key(m)))
    manifests: set[str] = set()
    for snap in meta.snapshots:
        key = layout.list_key(layout.seqno_of_snapshot(snap.snapshot_id))
        lst = roots.get(key)
        if lst is None:
            raise CorruptionError(f"{roots.where(key)}: the manifest list of a retained snapshot is missing")
        manifests |= {r.key for r in read_list(url, lst) if r.added}
    out: set[str] = set()
    for key in sorted(manifests):
        got = roots.get(key)
        if got is None:
            raise CorruptionError(f"{roots.where(key)}: a manifest of a retained snapshot is missing")
        out |= set(read_manifest_paths(url, got))
    return frozenset(out)


def garbage(url: str, head: Version, roots: RootObjects, cutoff: float) -> list[str]:
    """GC's collector: the view's objects older than ``cutoff`` that the newest metadata no longer
    needs: not it, not a file its metadata log names, not a retained snapshot's manifest list or a
    manifest one lists, not a newer metadata file, not the hint. None without a view."""
    m = newest(roots, head.seqno)
    data = None if m is None else roots.get(layout.metadata_key(m))
    if m is None or data is None:
        return []
    meta = md.decode(data, where=roots.where(layout.metadata_key(m)))
    prefix = layout.location(url, "")[: -len(layout.TABLE)]
    keep = {layout.HINT, layout.metadata_key(m), *(e.metadata_file[len(prefix):] for e in meta.metadata_log)}
    for snap in meta.snapshots:
        key = layout.list_key(layout.seqno_of_snapshot(snap.snapshot_id))
        keep.add(key)
        lst = roots.get(key)
        if lst is None:
            return []  # a retained snapshot is damaged: delete nothing (verify reports it)
        keep |= {r.key for r in read_list(url, lst)}
    return [o.key for o in roots.list(layout.METADATA) if o.key not in keep and o.modified <= cutoff
            and ((s := layout.seqno_of_metadata(o.key)) is None or s < m)]
