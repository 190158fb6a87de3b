"""``shardsink gc URL --desc DESC_ID``: delete what one description staged, as its fate allows.

::

    done = collect_description(shard, desc_id)          # or dry_run=True
    print(done.render())

The objects are those under ``parts/<desc_id>/`` and ``staging/<desc_id>/``; the deleting is
done by the fate primitive (:meth:`shardsink.core.admin.AdminHandle.delete_staged`), which
re-derives the fate from a fresh state read right before deleting:

* committed: deletes only what its batch does not reference (a retried slot's parts, the
  manifests); its batch stays;
* cannot commit (the shard's upper passed its lower): deletes all of it, whatever its age;
* may still commit (StillPossible): refused, nothing deleted (DeleteRefusedError, exit 2);
* unknown (its evidence is older than the retained history): refused here before the
  primitive is called (FateUnknownError, exit 5): whether its rows are in the shard is not
  known, so an operator looks at the data first.

The description's lower comes from its batch at the head, else its manifests, else the first
``_time`` of a readable part (:func:`shardsink.maintenance.leftovers.description_lower`): never
from the caller, since a wrong lower would decide a wrong fate. A compaction's output, or a
description whose manifest cannot be read, is refused: the compaction sweep decides those.
No grace period applies: the fate alone decides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from shardsink.core import fate as ft
from shardsink.core.checks import check_desc_id
from shardsink.core.shard import Shard
from shardsink.errors import FateUnknownError, InvalidUsageError
from shardsink.maintenance.gc_staged import left_alone
from shardsink.maintenance.leftovers import FateName, description_lower


@dataclass(frozen=True)
class DescriptionGc:
    """What ``gc --desc`` did (or, ``dry_run``, would do) to one description's staged objects."""

    url: str
    desc_id: str
    dry_run: bool
    lower: int | None = None
    fate: FateName | None = None  # None: nothing was staged
    parts_deleted: int = 0
    part_bytes_deleted: int = 0
    manifests_deleted: int = 0
    kept: int = 0  # parts its committed batch references

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        if self.fate is None:
            return f"{self.url}: nothing staged under parts/{self.desc_id}/ or staging/{self.desc_id}/"
        verb = "would delete" if self.dry_run else "deleted"
        kept = f"; kept {self.kept} parts of its committed batch" if self.kept else ""
        return (f"{self.url}: description {self.desc_id} ({self.fate.replace('_', ' ')}, lower {self.lower}): "
                f"{verb} {self.parts_deleted} parts ({self.part_bytes_deleted} bytes) and "
                f"{self.manifests_deleted} manifests{kept}")


def collect_description(shard: Shard, desc_id: str, *, dry_run: bool = False) -> DescriptionGc:
    """Delete (``dry_run``: count) what ``desc_id`` staged that its fate lets go (module docstring)."""
    check_desc_id(desc_id)
    admin = shard.admin()
    staged = admin.list_staged(desc_id)
    if not staged:
        return DescriptionGc(shard.url, desc_id, dry_run)
    parts = [o for o in staged if o.kind == "part"]
    manifests = [o for o in staged if o.kind == "manifest"]
    why = None if admin.is_compaction(desc_id) else left_alone(admin, manifests)
    if admin.is_compaction(desc_id) or why is not None:
        what = "is a compaction's output" if why is None else why
        raise InvalidUsageError(f"description {desc_id} {what}; the compaction sweep (`shardsink compact`) decides "
                                "it; nothing deleted", value=desc_id)
    head = admin.head()
    known = next((b.lower for b in admin.batches_at(head.header) if b.desc_id == desc_id), None)
    lower, where = description_lower(admin, parts, manifests, known)
    if lower is None:
        raise InvalidUsageError(f"the lower of description {desc_id} is not known ({where}); its fate cannot be "
                                "decided, nothing deleted", value=desc_id)
    fate = admin.fate(desc_id, lower)
    if isinstance(fate, ft.Unknown):
        raise FateUnknownError(
            f"whether description {desc_id} (lower {lower}) committed is not known: its evidence is older than "
            f"the retained history (oldest version {fate.oldest}); nothing deleted. Check the shard's rows in its "
            "range (`shardsink changes`) before re-sending them", value=desc_id)
    if dry_run:
        if isinstance(fate, ft.StillPossible):
            raise ft.DeleteRefusedError(f"description {desc_id} may still commit on {shard.url} (shard upper "
                                        f"{fate.upper}, its lower {lower} from {where}); nothing would be deleted")
        return _counted(shard.url, desc_id, lower, fate, parts, manifests, dry_run=True)
    done = admin.delete_staged(desc_id, lower)  # re-derives the fate; refuses StillPossible
    assert not isinstance(done.fate, ft.StillPossible)  # only parts vouched unpublished go under it
    out = _counted(shard.url, desc_id, lower, done.fate, parts, manifests, dry_run=False)
    return replace(out, parts_deleted=done.parts, manifests_deleted=done.manifests)


def _counted(url: str, desc_id: str, lower: int, fate: ft.Committed | ft.CannotCommit | ft.Unknown,
             parts: list[Any], manifests: list[Any], *, dry_run: bool) -> DescriptionGc:
    keep = fate.keys if isinstance(fate, ft.Committed) else frozenset()
    gone = [o for o in parts if o.key not in keep]
    name: FateName = ("committed" if isinstance(fate, ft.Committed)
                      else "unknown" if isinstance(fate, ft.Unknown) else "cannot_commit")
    return DescriptionGc(url, desc_id, dry_run, lower, name, len(gone), sum(o.size for o in gone), len(manifests),
                         len(parts) - len(gone))
