"""``verify``'s check of the Iceberg view: every file a retained snapshot or the metadata log
references exists, and the newest snapshot lists exactly the live parts of its shard version.

A view behind the shard is not a problem (it is caught up by the next commit or ``sync``); a
view that references a missing file, or whose newest snapshot's files differ from the shard's
parts at that version, is.
"""

from __future__ import annotations

from shardsink.core.roots import RootObjects
from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.iceberg import layout
from shardsink.iceberg import metadata as md
from shardsink.iceberg.avro_files import read_list, read_manifest_paths
from shardsink.iceberg.keeper import newest

Problems = list[tuple[str, str]]


def check(url: str, head: Version, roots: RootObjects) -> Problems:
    """The view's problems (``(object, what is wrong)``); none without a view."""
    m = newest(roots, head.seqno)
    data = None if m is None else roots.get(layout.metadata_key(m))
    if m is None or data is None:
        return []
    meta = md.decode(data, where=roots.where(layout.metadata_key(m)))
    present = {o.key for o in roots.list(layout.METADATA)}
    shard = Shard(url)
    parts = {o.key for o in shard.admin().list_parts()}
    out: Problems = []
    for e in meta.metadata_log:
        key = e.metadata_file.removeprefix(layout.location(url, ""))
        if f"{layout.TABLE}{key}" not in present and key not in present:
            out.append((e.metadata_file, f"named by the metadata log of {layout.metadata_key(m)} but missing"))
    files: dict[int, set[str]] = {}
    for snap in meta.snapshots:
        files[snap.snapshot_id] = _snapshot_files(url, roots, snap, present, out)
        out += [(layout.location(url, k), f"a data file of snapshot {snap.snapshot_id} is missing")
                for k in sorted(files[snap.snapshot_id] - parts)]
    current = meta.current()
    v = shard.reader().version(m)
    if current is not None and v is not None:
        live = {p.key for b in shard.reader().batches(v) for p in b.parts}
        if files.get(current.snapshot_id) != live:
            out.append((roots.where(layout.metadata_key(m)),
                        f"its current snapshot lists {len(files.get(current.snapshot_id, ()))} files, the shard's "
                        f"version {m} has {len(live)} live parts; they differ"))
    return out


def _snapshot_files(url: str, roots: RootObjects, snap: md.Snapshot, present: set[str], out: Problems) -> set[str]:
    key = layout.list_key(layout.seqno_of_snapshot(snap.snapshot_id))
    lst = roots.get(key) if key in present else None
    if lst is None:
        out.append((roots.where(key), f"the manifest list of snapshot {snap.snapshot_id} is missing"))
        return set()
    files: set[str] = set()
    for ref in read_list(url, lst):
        got = roots.get(ref.key) if ref.key in present else None
        if got is None:
            out.append((roots.where(ref.key), f"a manifest of snapshot {snap.snapshot_id} is missing"))
        elif ref.added:
            files |= set(read_manifest_paths(url, got))
    return files
