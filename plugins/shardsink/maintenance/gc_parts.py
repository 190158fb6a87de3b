"""GC step 4: staged objects (``parts/`` and ``staging/``) that nothing retained references.

Lists both prefixes FIRST, then reads the head and what ``[oldest, head]`` references;
every listed object that is unreferenced and older than the grace period goes, with its
description and lower, to :func:`shardsink.core.fate.delete_staged_many` (``only=``
exactly the vetted keys), the only deleter of staged data: it re-derives each fate from
a fresh head read, refuses a description that may still commit and keeps a committed
one's batch. Descriptions with a compaction manifest or a manifest this shardsink cannot
read are left alone (:mod:`shardsink.maintenance.gc_staged` reads manifests and parts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from shardsink.core import after_commit
from shardsink.core import fate as ft
from shardsink.core import state as st
from shardsink.core.admin import AdminHandle, StagedObject, is_manifest
from shardsink.core.roots import RootObjects
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, ShardsinkError
from shardsink.maintenance.gc_staged import left_alone, manifest_lower, min_time
from shardsink.maintenance.gc_types import StepHook
from shardsink.maintenance.history import Listing, Protected, list_state, protected

#: Descriptions per ``delete_staged_many`` call in GC.
_CHUNK = 500


@dataclass
class PartsOutcome:
    parts: int = 0
    bytes: int = 0
    manifests: int = 0
    young: int = 0
    view_objects: int = 0  # objects of derived views (the Iceberg view) deleted
    still_possible: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def count_gone(self, keys: frozenset[str] | None, keep: frozenset[str], sizes: dict[str, int]) -> None:
        """Count ``keys`` but ``keep`` as deleted: manifests under ``staging/``, else parts."""
        for k in sorted(keys or ()):
            if k in keep:
                continue
            if is_manifest(k):
                self.manifests += 1
            else:
                self.parts += 1
                self.bytes += sizes[k]


def collect_parts(shard: Shard, retained_from: int, listing: Listing, *, cutoff: float, dry: bool,
                  hook: StepHook, lowers: dict[str, int]) -> PartsOutcome:
    """Step 4: unreferenced parts and manifests older than the grace period, via delete_staged.
    ``lowers``: batch lowers known from the versions this run deleted."""
    admin = shard.admin()
    out = PartsOutcome()
    # SUBTLE: list BEFORE reading what is referenced. A part committed after the listing
    # is referenced by the head read below; one committed after that read was staged by a
    # writer older than the grace period, which the protocol forbids (and fate re-checks).
    listed_parts = admin.list_parts()
    listed_staging = admin.list_manifests()
    head = admin.head()
    try:
        refs = protected(admin, retained_from, head, listing if dry else list_state(admin))
    except CorruptionError as e:
        out.skipped.append(f"parts and manifests not collected: the retained history is unreadable ({e})")
        return out
    try:  # parts a derived view (the Iceberg view's retained snapshots) still references: kept
        held = after_commit.held_parts(shard.url, head, RootObjects(shard.url)) if head.header.options else frozenset()
    except Exception as e:  # its references unknown: keep every part this pass
        out.skipped.append(f"parts and manifests not collected: a view's references are unknown ({e})")
        return out
    listed_parts = [o for o in listed_parts if o.key not in held]
    _collect_views(admin, shard.url, head, cutoff=cutoff, dry=dry, out=out)

    groups, manifests = _group_unreferenced(listed_parts, listed_staging, refs, cutoff=cutoff, out=out)
    condemned, sizes = _condemn(admin, groups, manifests, refs, lowers, cutoff=cutoff, out=out)
    _delete_condemned(admin, head, refs, condemned, sizes, dry=dry, hook=hook, out=out)
    return out


def _collect_views(admin: AdminHandle, url: str, head: st.Version, *, cutoff: float, dry: bool,
                   out: PartsOutcome) -> None:
    """The derived views' own objects they no longer need (an old Iceberg metadata file, a manifest of
    an expired snapshot), older than the grace period: deleted (a dry run: counted) as root objects."""
    if not head.header.options:
        return
    try:
        doomed = after_commit.view_garbage(url, head, RootObjects(url), cutoff)
        if doomed and not dry:
            admin.delete_registered(doomed)
        out.view_objects += len(doomed)
    except Exception as e:  # a view's garbage unknown: nothing of it deleted this pass
        out.skipped.append(f"a view's old objects not collected ({e})")


def _group_unreferenced(listed_parts: list[StagedObject], listed_staging: list[StagedObject], refs: Protected, *,
                        cutoff: float, out: PartsOutcome
                        ) -> tuple[dict[str, list[StagedObject]], dict[str, list[StagedObject]]]:
    """The unreferenced parts older than the grace period and every manifest, by description."""
    groups: dict[str, list[StagedObject]] = defaultdict(list)
    manifests: dict[str, list[StagedObject]] = defaultdict(list)
    for o in listed_parts:
        if refs.covers(o.key):
            continue
        if o.modified > cutoff:
            out.young += 1
            continue
        d = o.desc_id
        if d is None:
            out.skipped.append(f"{o.key}: not under parts/<description>/; left alone")
            continue
        groups[d].append(o)
    for o in listed_staging:
        d = o.desc_id
        if d is None:
            out.skipped.append(f"{o.key}: not under staging/<description>/; left alone")
            continue
        manifests[d].append(o)
    return groups, manifests


def _condemn(admin: AdminHandle, groups: dict[str, list[StagedObject]], manifests: dict[str, list[StagedObject]],
             refs: Protected, lowers: dict[str, int], *, cutoff: float, out: PartsOutcome
             ) -> tuple[list[ft.Condemned], dict[str, int]]:
    """Each description's vetted keys with its lower, for ``delete_staged_many``; and the keys' sizes."""
    condemned: list[ft.Condemned] = []
    sizes: dict[str, int] = {}
    for d in sorted(set(groups) | set(manifests)):
        why = left_alone(admin, manifests.get(d, []))
        if why is not None:
            out.skipped.append(f"description {d}: {why}")
            continue
        old_manifests = [o for o in manifests.get(d, []) if o.modified <= cutoff]
        out.young += len(manifests.get(d, [])) - len(old_manifests)
        doomed = groups.get(d, []) + old_manifests
        if not doomed:
            continue
        lower = refs.lowers.get(d, lowers.get(d))
        if lower is None:
            lower = manifest_lower(admin, manifests.get(d, []))
        if lower is None and groups.get(d):
            lower = min_time(admin, groups[d])
        if lower is None:
            out.skipped.append(f"description {d}: lower unknown (no retained batch, manifest or readable part); kept")
            continue
        sizes.update((o.key, o.size) for o in doomed)
        condemned.append(ft.Condemned(d, lower, frozenset(o.key for o in doomed), manifests=bool(old_manifests)))
    return condemned, sizes


def _delete_condemned(admin: AdminHandle, head: st.Version, refs: Protected, condemned: list[ft.Condemned],
                      sizes: dict[str, int], *, dry: bool, hook: StepHook, out: PartsOutcome) -> None:
    """Delete (dry run: predict) the condemned descriptions' objects through ``delete_staged_many``."""
    # Descriptions in chunks: each chunk is one head read and one multi-object delete
    # (``delete_staged_many``), so GC costs a few requests per pass, not several per part.
    for i in range(0, len(condemned), _CHUNK):
        chunk = condemned[i:i + _CHUNK]
        if dry:
            for c in chunk:
                try:
                    out.count_gone(c.only, _predicted_keep(admin, head, refs, c.desc_id, c.lower), sizes)
                except ft.DeleteRefusedError:
                    out.still_possible.append(c.desc_id)
            continue
        try:
            results = admin.delete_staged_many(chunk)
        except ShardsinkError as e:
            out.skipped += [f"description {c.desc_id}: {e}" for c in chunk]
            continue
        for c in chunk:
            res = results[c.desc_id]
            if isinstance(res, ft.DeleteRefusedError):
                out.still_possible.append(c.desc_id)
                continue
            out.count_gone(c.only, res.fate.keys if isinstance(res.fate, ft.Committed) else frozenset(), sizes)
        hook("desc")


def _predicted_keep(admin: AdminHandle, head: st.Version, refs: Protected, d: str, lower: int) -> frozenset[str]:
    """Dry run: what delete_staged would keep once the versions below the horizon are gone
    (DeleteRefusedError if the description may still commit)."""
    if head.header.committed_seqno(d) is not None:
        fate = admin.fate(d, lower)  # its commit version is retained: the real answer
        if isinstance(fate, ft.Committed):
            return fate.keys
    if head.header.upper is not None and head.header.upper <= lower:
        raise ft.DeleteRefusedError(f"{d} may still commit")
    return refs.keys.get(d, frozenset())
