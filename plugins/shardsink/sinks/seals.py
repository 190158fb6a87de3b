"""When the shard sealed which times: the evidence the late-data checks of the sources compare with.

Contract: :func:`seals` lists, oldest first, one :class:`~shardsink.sources.base.Seal` per
recent commit whose *kind* seals times (:meth:`shardsink.core.commits.CommitRecord.sealed`:
create, append, close), stamped with the time of the source listing that fixed the commit's
input when it records one (:class:`shardsink.core.commits.Listing`: a landing-zone mint's),
else with the commit's time, plus one per committed
re-processing correction of ``[A, B)``, which *re-seals* ``[A, B)`` at its commit time. A
compaction, since advance, retention or schema commit seals nothing, whatever bounds its
record carries: it must never make a late file look on time (a late file whose earliest
time is "re-sealed" by maintenance would be half ingested, its rows below the description's
lower dropped). It reads the last ``limit`` commits (:data:`SEAL_HISTORY` by default),
corrections from the records of the parts each commit added
(:meth:`shardsink.core.state.PartMeta.corrected_range`; not from the live batch list, which
a compaction rewrites). When the window does not reach the create (a long or collected
history), a *horizon* seal stands for the commits before it: every time below the oldest
retained version's upper was sealed no later than that version's commit.
"""

from __future__ import annotations

from datetime import datetime

from shardsink.core.commits import END_OF_TIME, MIN_TIME
from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.sources.base import Seal

#: How far back (in commits) late-data checks look for the commit that sealed a time.
SEAL_HISTORY = 200


def seals(shard: Shard, *, limit: int = SEAL_HISTORY, head: Version | None = None) -> list[Seal]:
    """When the recent commits sealed which times (for late-data checks), ordered by seqno.

    A committed re-processing correction of ``[A, B)`` re-reads the source there, so it
    *re-seals* ``[A, B)`` at its commit time (files re-landed before it are not late).
    ``head``: a version the caller already read (one head read per task), else a fresh one.
    """
    out = []
    reader = shard.reader()
    window = list(reversed(reader.history(limit=limit, head=head if head is not None else reader.head())))
    if window and window[0].seqno > 0:
        # A truncated history: every time below the oldest retained version's upper was sealed
        # at or before that version's commit, so a file newer than it holding such times is late.
        first = window[0]
        upper = first.header.upper if first.header.upper is not None else END_OF_TIME
        out.append(Seal(MIN_TIME, upper, first.seqno, datetime.fromisoformat(first.commit.at).timestamp()))
    for v in window:
        sealed = v.commit.sealed()
        if sealed is None:
            continue
        at = datetime.fromisoformat(v.commit.at).timestamp()
        listing = getattr(v.commit, "listing", None)
        if listing is not None:  # sealed as of the listing that fixed the batch's input
            out.append(Seal(sealed[0], sealed[1], v.seqno, listing.at, frozenset(listing.held)))
        else:
            out.append(Seal(sealed[0], sealed[1], v.seqno, at))
        corrected = {r for b in v.added for p in b.parts if (r := p.corrected_range()) is not None}
        out += [Seal(r[0], r[1], v.seqno, at) for r in sorted(corrected)]
    return out
