"""When the shard sealed which times: the evidence the late-data checks of the sources compare with.

Contract: :func:`seals` lists, oldest first, one :class:`~shardsink.sources.base.Seal` per
recent commit that moved the upper (``[lower, upper)`` sealed at the commit's time; a
``create`` seals everything below its upper), plus one per committed re-processing
correction of ``[A, B)``, which *re-seals* ``[A, B)`` at its commit time. It reads the
last ``limit`` commits (:data:`SEAL_HISTORY` by default) and the live batch list.
"""

from __future__ import annotations

from datetime import datetime

from shardsink.core.shard import Shard
from shardsink.core.state import Version
from shardsink.sinks.reprocess import corrected_range
from shardsink.sources.base import Seal

#: How far back (in commits) late-data checks look for the commit that sealed a time.
SEAL_HISTORY = 200


def seals(shard: Shard, *, limit: int = SEAL_HISTORY, head: Version | None = None) -> list[Seal]:
    """When the recent commits sealed which times (for late-data checks), oldest first.

    A committed re-processing correction of ``[A, B)`` re-reads the source there, so it
    *re-seals* ``[A, B)`` at its commit time (files re-landed before it are not late).
    ``head``: a version the caller already read (one head read per task), else a fresh one.
    """
    out = []
    reader = shard.reader()
    head = head if head is not None else reader.head()
    log = list(reversed(reader.log(limit=limit, head=head)))
    at_of = {seqno: datetime.fromisoformat(c.at).timestamp() for seqno, c in log}
    for seqno, c in log:
        if c.upper is None:
            continue
        lower = -(2**63) if c.kind == "create" or c.lower is None else c.lower
        out.append(Seal(lower, c.upper, seqno, at_of[seqno]))
    resealed = {(r, b.seqno) for b in reader.batches(head) if b.seqno in at_of
                for p in b.parts if (r := corrected_range(p.key)) is not None}
    out += [Seal(r[0], r[1], seqno, at_of[seqno]) for r, seqno in sorted(resealed, key=lambda x: x[1])]
    return sorted(out, key=lambda s: s.seqno)
