"""The one state read behind :func:`shardsink.core.census.census`: what is live, awaiting GC, in flight or leaked.

::

    got = take_census(shard, now=time.time(), grace_s=3600)
    print(got.render())               # 13 live (…), 11 awaiting GC (…), 0 in flight (…), 0 leaked (…)
    for o in got.of("leaked"): ...    # each with why, and what acts on it

``shardsink verify``, ``shardsink inspect --objects``, GC's dry run and the Shards page all ask
this; none keeps a definition of its own. It reads what GC reads, in GC's order, and judges
with GC's own rules: the retained range and horizon (:mod:`.gc_horizon`), what the retained
versions reference (:func:`.history.removed_after`: the removal chain) and the fates of
unreferenced descriptions (:func:`.leftovers.classify`).

Cost: one listing of the whole shard, the head, GC's horizon (every lease object, the hint, the
versions its bisections touch, per compaction still retained a bisection over version ages),
one version read per retained compaction, and for each description with unreferenced objects
its manifests (or a part's first ``_time``) and, when its lower is at the upper, its fate.
Meant for operators and maintenance, not hot paths.
"""

from __future__ import annotations

import time
from typing import Literal

import shardsink.reclock.layout  # noqa: F401  (registers reclock's root objects: not unknown)
from shardsink.core import checks as ck
from shardsink.core import state as st
from shardsink.core.admin import AdminHandle, StagedObject
from shardsink.core.census import Census, Fated, StateRead, census, split, unreferenced
from shardsink.core.shard import Shard
from shardsink.errors import ShardsinkError
from shardsink.maintenance.gc_horizon import read_horizon, releases
from shardsink.maintenance.gc_types import DEFAULT_GRACE_S, GcOptions
from shardsink.maintenance.history import Listing, removed_after
from shardsink.maintenance.leftovers import classify
from shardsink.sinks.cancel import CANCEL_PREFIX  # noqa: F401  (registers the slots' failure markers)
from shardsink.sources.landing import layout as _landing_layout  # noqa: F401  (registers the index and plans)


def take_census(shard: Shard, *, now: float | None = None, grace_s: float = DEFAULT_GRACE_S,
                retention: int | Literal["shard"] | None = "shard") -> Census:
    """Every object of ``shard`` in its class (:mod:`shardsink.core.census`), judged at ``now``
    (epoch seconds; default the clock) with GC's grace period ``grace_s`` and ``retention``
    (as :class:`~shardsink.maintenance.gc_types.GcOptions`: the shard's own by default).

    SUBTLE: the shard is listed BEFORE the head is read, as GC does: an object committed after
    the listing is referenced by the head read; one the listing holds that a later commit
    references is young, so in flight, never leaked. CorruptionError if the retained history
    cannot be read (``shardsink verify`` names why).
    """
    ck.check_seconds(grace_s, what="grace period")
    t = time.time() if now is None else now
    admin = shard.admin()
    layout = split(admin.list_objects())
    hr = read_horizon(shard, GcOptions(grace_s=grace_s, retention=retention), now=t,
                      listing=Listing(layout.state.versions, layout.state.rollups))
    head = hr.head
    live = frozenset(p.key for b in admin.batches_at(head.header) for p in b.parts)
    removed = removed_after(admin, head, above=hr.oldest_present)
    when = releases(hr, removed.values(), now=t, grace_s=grace_s)
    retained = {d: when[r] for d, r in removed.items()}
    pending = unreferenced(layout, live=live, retained=retained)
    fates = {d: _fate(admin, d, parts, manifests, head, now=t) for d, (parts, manifests) in pending.items()}
    live_leases = {x.key for x in hr.live_leases}
    expired = frozenset(x.key for x in hr.leases if x.key not in live_leases)
    read = StateRead(head.seqno, hr.oldest_present, live, retained, fates, expired)
    return census(layout, read, now=t, grace_s=grace_s)


def _fate(admin: AdminHandle, desc_id: str, parts: list[StagedObject], manifests: list[StagedObject],
          head: st.Version, *, now: float) -> Fated:
    """What the fate of ``desc_id`` says of its unreferenced objects: read only where the head's
    upper does not settle it (``precise=False``: any final fate is named ``cannot_commit``)."""
    try:
        lo = classify(admin, desc_id, parts, manifests, head_upper=head.header.upper, now=now, precise=False)
    except ShardsinkError as e:  # a broken history: verify reports it as a problem
        return Fated("undecided", f"its fate cannot be read ({e})")
    return Fated(lo.fate, lo.note)
