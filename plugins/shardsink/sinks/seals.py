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
from shardsink.core.read import ReadHandle
from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.sources.base import Seal

#: How far back (in commits) late-data checks look for the commit that sealed a time.
SEAL_HISTORY = 200


def seals(shard: Shard, *, limit: int = SEAL_HISTORY, head: Version | None = None,
          down_to: int | None = None) -> list[Seal]:
    """When the recent commits sealed which times (for late-data checks), ordered by seqno.

    A committed re-processing correction of ``[A, B)`` re-reads the source there, so it
    *re-seals* ``[A, B)`` at its commit time (files re-landed before it are not late).
    ``head``: a version the caller already read (one head read per task), else a fresh one.
    ``down_to``: only the seals of times from ``down_to`` up are needed: the history is read
    back from the head in small steps only until the commit that sealed ``down_to`` (so the cost
    follows how far back the caller looks, not the shard's history); None: ``limit`` commits.
    """
    reader = shard.reader()
    top = head if head is not None else reader.head()
    window = _window(reader, top, limit, down_to)
    out = []
    if window and window[0].seqno > 0 and (down_to is None or not _reaches(window[0], down_to)):
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


#: How many versions a ``down_to`` walk fetches at a time (in parallel).
_STEP = 8


def _reaches(v: Version, t: int) -> bool:
    """Whether ``v``'s commit sealed ``t`` or an earlier time (its seal starts at or below ``t``)."""
    sealed = v.commit.sealed()
    return sealed is not None and sealed[0] <= t


def _window(reader: ReadHandle, top: Version, limit: int, down_to: int | None) -> list[Version]:
    """The versions from ``top`` back, oldest first: ``limit`` of them, or (``down_to``) only back
    to the one that sealed ``down_to`` (at most ``limit``)."""
    if down_to is None:
        return list(reversed(reader.history(limit=limit, head=top)))
    got: list[Version] = []
    oldest = top
    while len(got) < limit:
        step = reader.history(limit=min(_STEP + 1, limit - len(got) + 1), head=oldest)
        fresh = step[1:] if got else step  # each step starts at the oldest version already held
        got += fresh
        if not fresh or any(_reaches(v, down_to) for v in fresh) or fresh[-1].seqno == 0:
            break
        oldest = fresh[-1]
    return list(reversed(got))
