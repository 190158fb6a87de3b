"""The evidence a description's fate is decided from, gathered from ONE read of the state.

:func:`gather` (an append's description) and :func:`gather_compaction` (a compaction of
given inputs) read at most one head (none if the caller passes the version it read) and
then only immutable versions, galloping and bisecting through the retained history; the
pure rule that turns :class:`Evidence` into a fate is :func:`shardsink.core.fate.decide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsink.core import state as st
from shardsink.errors import CorruptionError, InvalidUsageError

if TYPE_CHECKING:
    from shardsink.core.machine import Machine


def passed(upper: int | None, lower: int) -> bool:
    """Whether an upper (None: closed) is past ``lower``."""
    return upper is None or upper > lower


@dataclass(frozen=True)
class Evidence:
    """What one read of the shard's state knows about one description.

    ``head`` is the header read. ``crossing`` is the version that committed ``desc_id``
    per ``head.recent``, else the first retained version whose upper is past ``lower``
    (None if the upper has not passed it). ``horizon`` is the batch list at
    ``crossing`` when the crossing is at the oldest retained version (the transition
    itself may be older), else None.
    """

    head: st.Header
    crossing: st.Version | None
    horizon: tuple[st.BatchMeta, ...] | None = None
    #: Compactions only: whether every input batch is live at ``head`` (None: a description).
    inputs_live: bool | None = None





def gather(machine: Machine, desc_id: str, lower: int, *, head: st.Version | None = None) -> Evidence:
    """The evidence about ``desc_id`` from ONE head read (``head``, or a fresh one)."""
    v = head if head is not None else machine.head().version
    h = v.header
    s = h.committed_seqno(desc_id)
    if s is not None:
        return Evidence(h, _must_fetch(machine, s, desc_id))
    if not passed(h.upper, lower):
        return Evidence(h, None)
    crossing, at_horizon = _find_crossing(machine, v, lower)
    horizon = machine.full_batches(crossing) if at_horizon else None
    return Evidence(h, crossing, horizon)


def gather_compaction(machine: Machine, cid: str, inputs: Sequence[st.BatchMeta], *,
                      head: st.Version | None = None) -> Evidence:
    """The evidence about compaction ``cid`` of ``inputs`` from ONE head read."""
    if not inputs:
        raise InvalidUsageError(f"compaction {cid} has no inputs")
    v = head if head is not None else machine.head().version
    h = v.header
    s = h.committed_seqno(cid)
    if s is not None:
        return Evidence(h, _must_fetch(machine, s, cid))
    live = machine.full_batches(v)
    ids = {b.desc_id for b in live}
    if cid in ids or all(b.desc_id in ids for b in inputs):
        return Evidence(h, None, live, inputs_live=cid not in ids)
    gone = next(b for b in inputs if b.desc_id not in ids)
    removal, at_horizon = _find_removal(machine, v, gone)
    if at_horizon:
        # Removed at or below the oldest retained version: committed iff its output is
        # live there (if not, no retained version references the output at all).
        return Evidence(h, None, machine.full_batches(removal), inputs_live=False)
    return Evidence(h, removal, None, inputs_live=False)


def _find_removal(machine: Machine, head: st.Version, batch: st.BatchMeta) -> tuple[st.Version, bool]:
    """The version that removed ``batch`` (live from ``batch.seqno``, gone at ``head``), and
    whether the removal may be older (the result is the oldest retained version)."""

    def live_at(seqno: int) -> bool | None:
        got = machine.fetch(seqno)
        if got is None:
            return None  # below the oldest retained version
        return any(b.desc_id == batch.desc_id for b in machine.full_batches(got))

    lo, hi = batch.seqno, head.seqno  # live at lo (unless GC'd), not live at hi
    lo_known = live_at(lo) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = live_at(mid)
        if got is False:
            hi = mid
        else:  # live, or missing (then everything below is missing too)
            lo, lo_known = mid, got is True
    found = machine.fetch(hi)
    if found is None:
        raise CorruptionError(f"{machine.url}: state version {hi} is missing while looking for a removal")
    return found, not lo_known


def _must_fetch(machine: Machine, seqno: int, desc_id: str) -> st.Version:
    got = machine.fetch(seqno)
    if got is None:
        raise CorruptionError(f"{machine.url}: state version {seqno} (commit of {desc_id}) is missing")
    return got


def _find_crossing(machine: Machine, head: st.Version, lower: int) -> tuple[st.Version, bool]:
    """The first retained version whose upper is past ``lower`` (the head's is), and whether
    it is the oldest retained one (so the actual crossing may be older).

    Galloping back from the head, then bisecting: versions below the oldest retained are
    missing (GC deletes oldest first), so "exists and passed" is monotone in seqno.
    """
    hi = head  # passed
    step = 1
    lo_seqno = -1  # a seqno known not passed (or missing); -1: below version 0
    while True:
        probe = hi.seqno - step
        if probe < 0:
            break
        v = machine.fetch(probe)
        if v is None or not passed(v.header.upper, lower):
            lo_seqno = probe
            break
        hi, step = v, step * 2
    while hi.seqno - lo_seqno > 1:
        mid = (lo_seqno + hi.seqno) // 2
        v = machine.fetch(mid)
        if v is None or not passed(v.header.upper, lower):
            lo_seqno = mid
        else:
            hi = v
    # Version 0 (the creation) as the crossing is the real one: nothing is older than it.
    below_retained = lo_seqno >= 0 and machine.fetch(lo_seqno) is None
    return hi, below_retained


