"""A description's fate, decided once from one state read, and the one way to delete what it staged.

::

    fate = read_fate(machine, desc_id, lower)   # Committed | CannotCommit | StillPossible | Unknown
    deleted = delete_staged(machine, desc_id, lower)   # re-derives the fate, then deletes

The **fate** of a description ``desc_id`` with lower bound ``lower``: :class:`Committed`
(a version committed it; ``keys``: its batch's part keys), :class:`CannotCommit` (not
committed, and the upper is past ``lower`` or the shard closed), :class:`StillPossible`
(not committed, the upper has not passed ``lower``: a commit may be in flight), or
:class:`Unknown` (the evidence is older than the retained history, see below).
:func:`decide` is the pure rule; :func:`gather` reads its evidence from ONE head
version (and immutable objects reachable from it). No other code answers "is this
description committed?".

**The evidence.** A batch ``[lower, x)`` can only be committed by the version that
moved the shard's upper past ``lower``: uppers are monotonic in seqno (appends raise
it, compaction keeps it, closing makes it infinite). That version is found in the
header's idempotency window (``recent``) or by a galloping search back from the head:
O(log distance) reads, and 2-3 for a race lost a moment ago. If the crossing is at or
below the oldest retained version, the records in the batch list there are the evidence
(:func:`_beyond_horizon`: appended batches and compacted batches' lineage); with none
that tells, the fate is Unknown.

**Deleting.** A description's staged objects are ``parts/<desc_id>/…`` and
``staging/<desc_id>/…``; only its own batch can reference a key under its prefixes.
:func:`delete_staged` (one description) and :func:`delete_staged_many` (GC: many, one
head read, multi-object deletes) are the only code that deletes them. It re-derives the fate
right before deleting: StillPossible deletes nothing (:class:`DeleteRefusedError`);
Committed keeps every key of its batch; CannotCommit and Unknown delete all of it.
For parts their writer never handed out (``unpublished``), StillPossible deletes them too.

**Compactions** have fates too (:func:`gather_compaction`, same :func:`decide`): a
compaction ``cid`` stages its output under ``parts/<cid>/`` and, when it applies, is
recorded in ``header.recent`` like a description id, and its output batch is named
``cid``. It is Committed if the window records it, or its output batch is live, or the
version that removed one of its inputs is its own; CannotCommit if an input was removed
by another version (inputs never come back, so it can never apply); StillPossible while
every input is live. The removal is found by bisection over the versions since the input
was added (liveness of a batch is one interval of seqnos).

SUBTLE: the fate must come from a single head read. Reading "committed?" from one
head and "upper?" from a newer one is the twin-append bug: a twin commits between the
two reads, the second read shows the upper past ``lower``, and the committed batch's
parts are deleted as a lost race's.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardsink.core import keys
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.evidence import Evidence, gather, gather_compaction, passed
from shardsink.errors import DescriptionConflictError, FateUnknownError, InvalidUsageError

if TYPE_CHECKING:
    from shardsink.core.machine import Machine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """``desc_id`` landed at ``seqno`` as the batch ``[lower, upper)``; ``keys`` are the part
    keys of its batch that the read state still references (none once compaction merged it)."""

    seqno: int
    keys: frozenset[str]
    rows: int
    #: The committed bounds (not part of equality: a fate is its commit, its parts and rows).
    lower: int | None = field(default=None, compare=False)
    upper: int | None = field(default=None, compare=False)
    #: Who committed it and when (ISO time), as the committing version's record says; None when
    #: the fate was decided from a batch record beyond the retained history.
    writer: str | None = field(default=None, compare=False)
    at: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CannotCommit:
    """Not committed and never can be: the shard's ``upper`` is past the lower (None: closed)."""

    upper: int | None


@dataclass(frozen=True)
class StillPossible:
    """Not committed; the shard's ``upper`` has not passed the lower (a compaction: every
    input is still live), so it may still commit. ``upper`` None: a closed shard."""

    upper: int | None


@dataclass(frozen=True)
class Unknown:
    """Not known whether it committed: the version that sealed its lower is older than the
    retained history (``oldest``: the oldest retained seqno) and no retained record tells.
    It can never commit (``upper`` is past its lower). Never reported as "not committed"."""

    upper: int | None
    oldest: int


Fate = Committed | CannotCommit | StillPossible | Unknown


class DeleteRefusedError(InvalidUsageError):
    """The description may still commit: nothing of it was deleted."""


def decide(ev: Evidence, desc_id: str, lower: int) -> Fate:
    """The pure fate rule (module docstring). Consistent with ``transitions.compare_and_append``:
    a ``desc_id`` in the idempotency window is committed whatever its bounds (the caller
    compares :attr:`Committed.lower`/``upper`` with its own: :func:`check_same_bounds`)."""
    c = ev.crossing
    crossed = c.commit.batch() if c is not None else None
    if c is not None and crossed is not None and crossed[0] == desc_id:
        batch = [p for b in c.added if b.desc_id == desc_id for p in b.parts]
        return Committed(c.seqno, frozenset(p.key for p in batch), sum(p.rows for p in batch), crossed[1], crossed[2],
                         c.commit.writer, c.commit.at)
    for b in ev.horizon or ():
        if b.desc_id == desc_id:
            return Committed(b.seqno, frozenset(p.key for p in b.parts), b.rows, b.lower, b.upper)
    upper = ev.head.upper
    if ev.inputs_live is not None:  # a compaction: it can apply only while every input is live
        return StillPossible(upper) if ev.inputs_live else CannotCommit(upper)
    if not passed(upper, lower):
        assert upper is not None
        return StillPossible(upper)
    if ev.horizon is None:  # the crossing version is retained: it alone could have committed desc_id
        return CannotCommit(upper)
    return _beyond_horizon(ev, desc_id, lower)


def _beyond_horizon(ev: Evidence, desc_id: str, lower: int) -> Fate:
    """The crossing may be older than the retained history: only records can tell.

    A record "description E committed ``[a, b)``" (an appended batch, or a compacted batch's
    lineage) with ``a <= lower < b`` decides: E is ``desc_id`` starting at ``lower``
    (Committed; its own parts are no longer referenced if it was merged), or ``desc_id``
    cannot have committed at ``lower`` (time ``lower`` was sealed by E's commit). With no
    such record (an empty batch leaves none; lineage is bounded) the answer is Unknown.
    """
    assert ev.horizon is not None and ev.crossing is not None
    records = [m for b in ev.horizon for m in tr.lineage_of(b)]
    for m in records:  # first: an id names one description, wherever its record is
        if m.desc_id == desc_id:
            return Committed(m.seqno, frozenset(), m.rows, m.lower, m.upper)
    if any(m.lower <= lower and passed(m.upper, lower) for m in records):
        return CannotCommit(ev.head.upper)
    return Unknown(ev.head.upper, ev.crossing.seqno)


# --- what a caller says of a fate that is not plain success ----------------------------------


def check_same_bounds(url: str, desc_id: str, fate: Committed, lower: int, upper: int | None) -> None:
    """DescriptionConflictError unless ``desc_id`` committed exactly ``[lower, upper)``.

    An id names one description: a request reusing a committed id with other bounds is
    refused (its rows would otherwise be dropped as "already committed").
    """
    if fate.lower is not None and (fate.lower, fate.upper) != (lower, upper):
        raise DescriptionConflictError(
            f"description id {desc_id!r} was committed on {url} as [{fate.lower}, {fate.upper}) at seqno "
            f"{fate.seqno}; this request is [{lower}, {upper}): an id names one description, use a fresh id "
            "for other bounds (nothing was written for this request)", value=desc_id)


def unknown_fate_error(url: str, desc_id: str, lower: int, upper: int | None, fate: Unknown) -> FateUnknownError:
    """The error that says so when a caller asks "did it commit?" and the fate is Unknown."""
    return FateUnknownError(
        f"whether description {desc_id} [{lower}, {upper}) was committed on {url} is unknown: the evidence is "
        f"older than the retained history (oldest retained state version {fate.oldest}; GC removed the version "
        f"that sealed time {lower}, and no retained batch or compaction lineage names it). It can no longer "
        f"commit. Do not re-send its rows under a fresh description before checking the shard's changes over "
        f"[{lower}, {upper}) (shard upper {fate.upper})", value=desc_id)


# --- reading the evidence (gathered by :mod:`shardsink.core.evidence`) ------------------------


def read_fate(machine: Machine, desc_id: str, lower: int, *,
              inputs: Sequence[st.BatchMeta] | None = None) -> Fate:
    """The fate of ``desc_id`` (lower bound ``lower``) from one fresh state read.

    ``inputs`` given: ``desc_id`` is a compaction id and these are its input batches.
    """
    if inputs is not None:
        return decide(gather_compaction(machine, desc_id, inputs), desc_id, lower)
    return decide(gather(machine, desc_id, lower), desc_id, lower)


# --- the one deletion path -----------------------------------------------------------------


@dataclass(frozen=True)
class Deleted:
    """What :func:`delete_staged` did: the fate it decided by, and how many objects went."""

    fate: Fate
    parts: int
    manifests: int

    @property
    def total(self) -> int:
        return self.parts + self.manifests


@dataclass(frozen=True)
class Condemned:
    """One description whose staged objects a caller wants gone (see :func:`delete_staged`
    for ``only``, ``manifests`` and ``inputs``)."""

    desc_id: str
    lower: int
    only: frozenset[str] | None = None
    manifests: bool = True
    inputs: tuple[st.BatchMeta, ...] | None = None
    #: A FINAL fate the caller already decided from a state version (see :func:`delete_staged`).
    decided: Committed | CannotCommit | Unknown | None = None
    #: The caller vouches ``only`` are parts it uploaded and never handed out (see :func:`delete_staged`).
    unpublished: bool = False


def delete_staged(machine: Machine, desc_id: str, lower: int, *, only: Collection[str] | None = None,
                  manifests: bool = True, inputs: Sequence[st.BatchMeta] | None = None,
                  decided: Committed | CannotCommit | Unknown | None = None, unpublished: bool = False) -> Deleted:
    """Delete the objects ``desc_id`` staged that its fate lets go; the ONLY deleter of them.

    Re-derives the fate from one fresh state read first. StillPossible ⇒ raises
    DeleteRefusedError, nothing deleted. Committed ⇒ deletes only keys its batch does not
    reference. CannotCommit ⇒ deletes everything under its prefixes. ``only`` restricts
    the parts considered to those keys (e.g. one retry's staged parts); keys outside the
    description's prefix are never touched. ``manifests=False`` keeps ``staging/``; with
    ``only`` given, the manifests considered are likewise restricted to the ``staging/``
    keys in ``only`` (GC passes exactly the objects it vetted as older than its grace).
    ``inputs`` given: ``desc_id`` is a compaction id and these its input batches (its
    output is deleted only if it can never apply).

    ``decided``: a fate the caller already decided in this task from a state version (an
    append task's one head read, or the version its own commit wrote: ``Committed`` with
    exactly the parts it committed). Only final fates are accepted, and they are final in
    the strict sense: uppers never move back, so a description that is committed, or whose
    lower the upper has passed, stays so in every later version; deciding again from a
    fresher read would give the same answer. A fate that may change (StillPossible) is
    never taken: the primitive reads afresh. SUBTLE: the caller vouches that ``decided`` came
    from the state (never from a guess): a Committed built from anything but the version
    that committed it would keep or delete the wrong parts.

    ``unpublished`` (with ``only``, no manifests): the caller vouches that ``only`` are parts it
    uploaded under fresh keys and never handed out (a staging that failed after its uploads).
    No commit can name a key nobody was given, so StillPossible deletes them too; Committed
    still keeps its batch's keys. SUBTLE: a published part deleted this way may be committed
    by a twin a moment later, and its batch would then be unreadable.
    """
    if decided is not None and not isinstance(decided, Committed | CannotCommit | Unknown):
        raise InvalidUsageError(f"delete_staged: decided must be a final fate, got {decided!r}")
    if unpublished and (only is None or manifests or inputs is not None or decided is not None):
        raise InvalidUsageError("delete_staged: unpublished takes only= parts, no manifests, inputs or decided")
    one = Condemned(desc_id, lower, frozenset(only) if only is not None else None, manifests,
                    tuple(inputs) if inputs is not None else None, decided, unpublished)
    got = delete_staged_many(machine, [one])[desc_id]
    if isinstance(got, DeleteRefusedError):
        raise got
    return got


def delete_staged_many(machine: Machine, condemned: Sequence[Condemned]) -> dict[str, Deleted | DeleteRefusedError]:
    """:func:`delete_staged` for many descriptions at once: every fate from ONE head read, then
    the doomed objects in one multi-object delete per 1,000 keys (GC's path: one request per
    description would cost more than the appends that staged them).

    Returns, per description id, what was deleted or the refusal (nothing of that one was
    deleted). Fates Committed, CannotCommit and Unknown are final, so deciding them all from
    one read and deleting afterwards is as safe as deciding each right before its delete.

    SUBTLE: Unknown deletes like CannotCommit. Whether it once committed is not known, but
    a deletion needs only this: it can never commit (the upper is past its lower), and the
    oldest retained batch list, which every retained batch descends from, does not name
    it, so nothing retained references its objects, nor ever will. Nothing of it is in
    flight (this is no unknown *outcome*). Callers asked "was it committed?" still say
    unknown (:class:`shardsink.errors.FateUnknownError`), never "not committed".
    """
    if len({c.desc_id for c in condemned}) != len(condemned):
        raise InvalidUsageError("delete_staged_many: a description may be condemned once per call")
    head = machine.head().version if any(c.decided is None for c in condemned) else None
    out: dict[str, Deleted | DeleteRefusedError] = {}
    doomed_parts: list[str] = []
    doomed_manifests: list[str] = []
    for c in condemned:
        fate: Fate
        if c.decided is not None:
            fate = c.decided
        elif c.inputs is not None:
            assert head is not None
            fate = decide(gather_compaction(machine, c.desc_id, c.inputs, head=head), c.desc_id, c.lower)
        else:
            assert head is not None
            fate = decide(gather(machine, c.desc_id, c.lower, head=head), c.desc_id, c.lower)
        if isinstance(fate, StillPossible) and not c.unpublished:
            what = ("its inputs are all live" if c.inputs is not None
                    else f"shard upper {fate.upper}, its lower {c.lower}")
            out[c.desc_id] = DeleteRefusedError(
                f"{'compaction' if c.inputs is not None else 'description'} {c.desc_id} may still commit on "
                f"{machine.url} ({what}); none of its staged objects were deleted"
            )
            continue
        keep = fate.keys if isinstance(fate, Committed) else frozenset()
        parts_prefix, staging_prefix = keys.staged_prefixes(c.desc_id)
        if c.only is None:
            candidates: Sequence[str] = [o.key for o in machine.blob.list(parts_prefix)]
        else:
            candidates = sorted(k for k in c.only if k.startswith(parts_prefix))
        doomed = [k for k in candidates if k not in keep]
        listed: Sequence[str] = ()
        if c.manifests:
            if c.only is None:
                listed = [o.key for o in machine.blob.list(staging_prefix)]
            else:
                listed = sorted(k for k in c.only if k.startswith(staging_prefix))
        doomed_parts += doomed
        doomed_manifests += listed
        out[c.desc_id] = Deleted(fate, len(doomed), len(listed))
        if doomed:
            why = ("not in its committed batch" if isinstance(fate, Committed)
                   else "(never handed out)" if c.unpublished else "(it can never commit)")
            log.info("description %s: deleting %d staged parts %s", c.desc_id, len(doomed), why)
    # Parts before manifests: a crash in between leaves a manifest naming its description
    # (compaction sweeps find their leftovers by them).
    for doomed in (doomed_parts, doomed_manifests):
        machine.blob.delete_many(doomed)
    return out
