"""GC's options and its report: what a caller asks of :func:`shardsink.maintenance.gc.collect`
and what it answers. Plain values, no I/O; the options are checked when constructed
(an invalid grace period, retention or delete batch is an ``InvalidUsageError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from shardsink.core import checks as ck
from shardsink.core.census import Census
from shardsink.errors import InvalidUsageError

DEFAULT_GRACE_S = 3600.0

#: A test hook called after each step (``anchored``, ``version`` (each chunk), ``versions``,
#: ``rollups``, ``desc``, ``parts``, ``leases``); tests inject a crash there.
StepHook = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class GcOptions:
    """``grace_s``: never delete an object younger than this. ``retention``: ms of history
    to keep (``"shard"``: the shard's own ``Header.retention``; None keeps all versions).
    ``dry_run``: decide and report, delete and write nothing. ``clock``: epoch seconds.
    ``after_step``: a test hook (:data:`StepHook`)."""

    grace_s: float = DEFAULT_GRACE_S
    retention: int | Literal["shard"] | None = "shard"
    dry_run: bool = False
    clock: Callable[[], float] = time.time
    after_step: StepHook | None = None
    #: State versions per multi-object delete (S3 takes up to 1,000 keys a request).
    delete_batch: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.delete_batch <= 1000:
            raise InvalidUsageError(f"delete_batch {self.delete_batch} must be between 1 and 1000")
        ck.check_seconds(self.grace_s, what="grace period")  # NaN and inf too: NaN acted as grace 0
        if self.retention is not None and self.retention != "shard":
            ck.check_duration_ms(self.retention, what="retention")


@dataclass(frozen=True)
class GcReport:
    url: str
    dry_run: bool
    head: int
    oldest_before: int
    oldest_after: int
    reason: str
    versions_deleted: int = 0
    rollups_deleted: int = 0
    parts_deleted: int = 0
    part_bytes_deleted: int = 0
    manifests_deleted: int = 0
    leases_expired: int = 0
    young_kept: int = 0
    still_possible: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default=())
    plans_deleted: int = 0
    #: A dry run's classification of every object, as of its clock (:mod:`shardsink.core.census`).
    objects: Census | None = None

    @property
    def objects_deleted(self) -> int:
        return (self.versions_deleted + self.rollups_deleted + self.parts_deleted + self.manifests_deleted
                + self.leases_expired + self.plans_deleted)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "still_possible": list(self.still_possible), "skipped": list(self.skipped),
                "objects_deleted": self.objects_deleted,
                "objects": None if self.objects is None else self.objects.to_dict()}

    def render(self) -> str:
        """For operators: ``deleted 5 objects: 2 versions, 3 parts (1,234 bytes), keeps versions 7..12``."""
        counts = [(self.versions_deleted, "version"), (self.rollups_deleted, "rollup"), (self.parts_deleted, "part"),
                  (self.manifests_deleted, "manifest"), (self.leases_expired, "expired lease"),
                  (self.plans_deleted, "plan")]
        what = ", ".join(f"{n:,} {name}{'' if n == 1 else 's'}" + (f" ({self.part_bytes_deleted:,} bytes)"
                                                                  if name == "part" else "")
                         for n, name in counts if n)
        verb, total = "would delete" if self.dry_run else "deleted", self.objects_deleted
        return (f"{verb} {total:,} object{'' if total == 1 else 's'}{f': {what}' if what else ''}, "
                f"keeps versions {self.oldest_after}..{self.head}")
