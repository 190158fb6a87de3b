"""One description's append, decided by its fate and carried out in core: the one way a
staged batch becomes a commit, or goes.

::

    settled = shard.settle(Claim(desc_id=d, lower=l, upper=u, slots=n))
    # AppendResult (committed | already_committed) | Refused | NotYet

:func:`settle` decides from ONE state read (or from ``decided``, a fate the caller decided
from a version it already holds, e.g. the version that committed the description before it)
and acts on the answer, so no caller re-derives a fate or deletes on its own:

* **Committed** (an earlier try, a twin, a lost acknowledgement): its leftovers are deleted (the
  committed batch's parts are kept) and it is reported ``already_committed``, after checking
  the id committed these same bounds (DescriptionConflictError otherwise);
* **CannotCommit** (the upper passed its lower): everything it staged is deleted; **Refused**
  names the shard's upper and how many objects went;
* **StillPossible** below its lower (its turn has not come): nothing is read or deleted;
  **NotYet** names the upper;
* **StillPossible** at its lower: its slots' manifests are read and verified
  (:func:`shardsink.core.staged.load_staged`: only now, so a description that cannot commit
  never pays for them), the conditional put is attempted, and the leftovers of the commit are
  deleted, decided from the committing version itself (no read). A refused put re-decides from
  a fresh read: a twin's commit of the same description is ``already_committed``, anything
  else Refused. Hooks ``append.before_commit`` and ``append.committed``
  (:mod:`shardsink.core.hooks`) fire around the put.

Unknown raises FateUnknownError and deletes nothing; UnknownOutcomeError, ShardClosedError and
CorruptionError propagate (the caller re-calls, which re-reads). Every deletion goes through
the one primitive (:meth:`WriteHandle.delete_staged`), which never deletes what may commit.

SUBTLE (twins): a twin may commit or delete at any moment between two steps. A load that
fails with CorruptionError (the twin settled the description and deleted its manifests under
our feet) is judged by a fresh fate read: Committed or CannotCommit settle as above; still
possible re-raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsink.core import fate as ft
from shardsink.core import hooks
from shardsink.core.commits import Listing
from shardsink.core.read import ReadHandle
from shardsink.core.staged import load_staged
from shardsink.core.write import AppendResult, WriteHandle
from shardsink.errors import CorruptionError, UpperMismatchError


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One description's claim on the shard: commit the batch ``[lower, upper)`` that its
    ``slots`` writer slots staged under ``desc_id``, recording ``writer`` and the source
    ``listing`` its input was fixed by. ``attempt``: the run's attempt that minted it (what
    the hooks name)."""

    desc_id: str
    lower: int
    upper: int | None
    slots: int = 1
    writer: str | None = None
    listing: Listing | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class Refused:
    """The description can never commit: the shard's upper is ``current`` (None: closed), past its
    lower; ``deleted`` objects it staged were deleted."""

    desc_id: str
    current: int | None
    deleted: int


@dataclass(frozen=True)
class NotYet:
    """The description may still commit, once the shard's upper (``upper``) reaches its lower."""

    desc_id: str
    upper: int | None


Settled = AppendResult | Refused | NotYet


def settle(handle: WriteHandle, reader: ReadHandle, claim: Claim, *, decided: ft.Fate | None = None) -> Settled:
    """Commit ``claim`` or say why not, deleting what its fate lets go (the module docstring).
    ``reader``: the same shard's read handle (a manifest without a schema id needs a head read)."""
    fate = decided if decided is not None else handle.fate(claim.desc_id, claim.lower)
    final = _final(handle, claim, fate)
    if final is not None:
        return final
    assert isinstance(fate, ft.StillPossible)
    if fate.upper != claim.lower:
        return NotYet(claim.desc_id, fate.upper)
    try:
        staged, props = load_staged(handle, reader, desc_id=claim.desc_id, lower=claim.lower, upper=claim.upper,
                                    slots=claim.slots)
        hooks.fire("append.before_commit", shard_url=handle.url, desc_id=claim.desc_id, attempt=claim.attempt)
    except CorruptionError:
        final = _final(handle, claim, handle.fate(claim.desc_id, claim.lower))
        if final is None:
            raise
        return final
    try:
        result = handle.compare_and_append(staged, expected_upper=claim.lower, new_upper=claim.upper,
                                           desc_id=claim.desc_id, writer=claim.writer, props=props,
                                           listing=claim.listing)
    except UpperMismatchError:
        return _refused(handle, claim)
    hooks.fire("append.committed", shard_url=handle.url, desc_id=claim.desc_id, attempt=claim.attempt,
               seqno=result.seqno)
    # Our own commit's version is the evidence: committed, with exactly the parts we staged
    # (an "already committed" answer is a twin's batch, whose parts we do not know: re-read).
    mine = ft.Committed(result.seqno, frozenset(p.key for s in staged for p in s.parts), result.rows,
                        claim.lower, claim.upper) if result.status == "committed" else None
    handle.delete_staged(claim.desc_id, claim.lower, decided=mine)
    return result


def _final(handle: WriteHandle, claim: Claim, fate: ft.Fate) -> AppendResult | Refused | None:
    """Act on a final fate (Committed, CannotCommit); None while it may still commit. Unknown raises
    before anything is deleted."""
    if isinstance(fate, ft.Unknown):  # nothing deleted, nothing claimed
        raise ft.unknown_fate_error(handle.url, claim.desc_id, claim.lower, claim.upper, fate)
    if isinstance(fate, ft.Committed | ft.CannotCommit):
        return _outcome(handle, claim, handle.delete_staged(claim.desc_id, claim.lower, decided=fate))
    return None


def _refused(handle: WriteHandle, claim: Claim) -> AppendResult | Refused:
    """After a refused put: the primitive decides from a fresh read before deleting. SUBTLE: it may
    show a twin's commit of this description: then this is no loss."""
    return _outcome(handle, claim, handle.delete_staged(claim.desc_id, claim.lower))


def _outcome(handle: WriteHandle, claim: Claim, gone: ft.Deleted) -> AppendResult | Refused:
    """What the deletion's fate says of ``claim``: ``already_committed`` (bounds checked), or Refused
    with the objects deleted; Unknown (GC passed it meanwhile) raises: never "lost" on an unknown
    history."""
    if isinstance(gone.fate, ft.Committed):
        return handle.already_committed(gone.fate, claim.desc_id, claim.lower, claim.upper)
    if isinstance(gone.fate, ft.Unknown):
        raise ft.unknown_fate_error(handle.url, claim.desc_id, claim.lower, claim.upper, gone.fate)
    return Refused(claim.desc_id, gone.fate.upper, gone.total)
