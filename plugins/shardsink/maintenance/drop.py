"""``shardsink drop URL --yes``: delete a whole shard, safely, saying what it deleted.

::

    plan = drop(shard, dry_run=True)      # what it would delete; refusals raised as below
    done = drop(shard)                    # close, then delete every object of the layout
    print(done.render())

What "safely" means here:

* **only a shard**: the URL must hold a shard (state versions: else ShardNotFoundError,
  exit 2), and only objects of the shard layout are deleted (state, parts, manifests,
  leases, the root objects capabilities registered); anything else under the root is left
  where it is and named (:attr:`DropReport.left`). A remap shard a reclocked source shares is
  a shard of its own, at its own URL, and is not touched;
* **nobody is using it** (refused with :class:`DropRefusedError`, exit 2, nothing written,
  unless ``force``): no live read lease, and no staged object in flight: no description that
  may still commit, and no unreferenced object younger than the grace period
  (:func:`shardsink.core.census.in_flight`);
* **fenced**: the shard is first CLOSED (a commit making its upper the empty frontier), so no
  append can commit while it goes (a writer racing the close makes it refuse: nothing
  deleted, the shard stays open); then :meth:`shardsink.core.admin.AdminHandle.drop_closed`
  deletes it, the newest state version last. A crash leaves a closed shard; run drop again.
  Layout objects found after the deletion (a straggler wrote them) are named, not hidden;
* **said**: the report counts every kind of object deleted, and the part bytes.

SUBTLE: a DAG that still ingests into the URL creates the shard anew at its next run
(``ingest_dag`` creates a missing shard): pause it first, and change its ``start_date`` or
``ShardOptions(initial_upper=)`` if that is why the shard is being dropped.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from shardsink.core.admin import DROP_KINDS, drop_kind
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError, ShardsinkError, UpperMismatchError
from shardsink.maintenance.gc_types import DEFAULT_GRACE_S
from shardsink.maintenance.leftovers import leftovers


class DropRefusedError(InvalidUsageError):
    """The shard is in use (a live lease, a writer in flight, a commit racing the close): nothing was deleted."""


@dataclass(frozen=True)
class DropReport:
    """What :func:`drop` deleted (``dry_run``: would delete), by kind (:data:`DROP_KINDS`)."""

    url: str
    dry_run: bool
    seqno: int  # the head's seqno when the drop began
    upper: int | None  # the shard's upper then (None: it was closed already)
    closed_at: int | None = None  # the seqno of the close this drop committed
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_KINDS, 0))
    part_bytes: int = 0
    left: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()  # the refusals ``force`` overrode
    #: Layout objects found after the drop: written meanwhile by a process still using the URL.
    late: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "dry_run": self.dry_run, "seqno": self.seqno, "upper": self.upper,
                "closed_at": self.closed_at, "deleted": dict(self.counts), "objects_deleted": self.total,
                "part_bytes": self.part_bytes, "left": list(self.left), "overridden": list(self.overridden),
                "late": list(self.late)}

    def render(self) -> str:
        what = ", ".join(f"{n:,} {k}{'' if n == 1 else 's'}" + (f" ({self.part_bytes:,} bytes)" if k == "part" else "")
                         for k, n in self.counts.items())
        lines = [f"{'would delete' if self.dry_run else 'deleted'} {self.total:,} objects of {self.url}: {what}"]
        if self.closed_at is not None:
            lines.insert(0, f"closed {self.url} at seqno {self.closed_at} (upper was {self.upper}): no append can "
                            "commit any more")
        for why in self.overridden:
            lines.append(f"in use (drop refuses unless --force): {why}" if self.dry_run else f"forced past: {why}")
        if self.left:
            lines.append(f"left {len(self.left)} objects that are not part of a shard: {_some(self.left)}")
        if self.late:
            lines.append(f"WARNING: {len(self.late)} objects of a shard were written while it was dropped (a process "
                         f"still uses {self.url}; stop it, then delete them by hand): {_some(self.late)}")
        return "\n".join(lines)


def _some(keys: tuple[str, ...]) -> str:
    return ", ".join(keys[:10]) + (f" (+{len(keys) - 10} more)" if len(keys) > 10 else "")


def blockers(shard: Shard, *, now: float | None = None, grace_s: float = DEFAULT_GRACE_S) -> list[str]:
    """Why dropping ``shard`` now could break someone: live leases, writers in flight (empty: none)."""
    t = time.time() if now is None else now
    out = [f"a live read lease {x.lease_id} held by {x.holder} (expires in {x.expires_at - t:.0f} s)"
           for x in shard.leases(now=t)]
    if shard.info().upper is None:
        return out  # closed: no description can commit
    try:
        found = leftovers(shard, now=t)
    except ShardsinkError as e:
        return [*out, f"whether a writer is in flight cannot be told ({e})"]
    for lo in found:
        why = next((w for o in lo.objects if (w := lo.in_flight(o, grace_s=grace_s)) is not None), None)
        if why is not None:
            out.append(f"a writer may be in flight: {why}; its newest object is {lo.youngest_s:.0f} s old")
    return out


def drop(shard: Shard, *, dry_run: bool = False, force: bool = False, now: float | None = None) -> DropReport:
    """Drop ``shard`` (module docstring). DropRefusedError (nothing deleted) while it is in use,
    unless ``force``; ``dry_run`` checks the same and counts what would go, writing nothing."""
    head = shard.admin().head()  # ShardNotFoundError: not a shard
    upper = head.header.upper
    found = blockers(shard, now=now)
    if found and not force:
        raise DropRefusedError(f"refusing to drop {shard.url}: " + "; ".join(found)
                               + ". Nothing was deleted. Stop its readers and writers (pause the DAGs using it), "
                               "or pass --force")
    if dry_run:
        return _planned(shard, head.seqno, upper, tuple(found))
    closed_at = None if upper is None else _close(shard, upper, force=force)
    got = shard.admin().drop_closed()
    late = tuple(o.key for o in shard.admin().list_objects() if drop_kind(o.key) is not None)
    return DropReport(shard.url, False, head.seqno, upper, closed_at, dict(got.counts), got.part_bytes,
                      tuple(k for k in got.left if k not in late), tuple(found), late)


def _planned(shard: Shard, seqno: int, upper: int | None, overridden: tuple[str, ...]) -> DropReport:
    counts = dict.fromkeys(DROP_KINDS, 0)
    part_bytes = 0
    left = []
    for o in shard.admin().list_objects():
        kind = drop_kind(o.key)
        if kind is None:
            left.append(o.key)
            continue
        counts[kind] += 1
        part_bytes += o.size if kind == "part" else 0
    return DropReport(shard.url, True, seqno, upper, None, counts, part_bytes, tuple(left), overridden)


def _close(shard: Shard, upper: int, *, force: bool) -> int:
    """Close the shard at ``upper`` (its seqno). A commit racing the close refuses the drop,
    unless ``force`` (then it closes at the new upper, up to five tries)."""
    for _ in range(5):
        try:
            return shard.close(expected_upper=upper, desc_id=f"drop-{uuid.uuid4().hex[:12]}").seqno
        except UpperMismatchError as e:
            if not force:
                raise DropRefusedError(f"refusing to drop {shard.url}: a writer committed while it was being "
                                       f"closed (upper {upper} -> {e.current}); nothing was deleted and it stays "
                                       "open. Stop its writers, or pass --force") from None
            if e.current is None:
                return shard.admin().head().seqno  # someone else closed it
            upper = e.current
    raise DropRefusedError(f"refusing to drop {shard.url}: writers kept committing while it was being closed")
