"""A run's append as one call with one typed outcome.

::

    outcome = append_run(shard, chain, slots, writer=w, turn=Turn(...), superseded=[...])
    # Appended | Waiting | Lost | Failed

``chain`` is one attempt's descriptions, in order (:func:`shardsink.sinks.ingest.mint_chain`).
Each description is settled by core (:meth:`shardsink.core.shard.Shard.settle`: one fate read
for the first, the committing version for each next one) and the chain's outcome is:

* **Waiting**: the chain was minted ahead and the shard's upper has not reached its lower yet
  (StillPossible below it): nothing is appended or deleted; the outcome names who it waits behind
  (the description staged at the upper and the DAG run owning it, or what is missing);
* **Failed** (for good, the caller must not retry): the wait lasted past ``turn.max_wait``, the
  shard is closed, or its state is corrupt;
* **Lost**: nothing committed: every description lost its race (its staged objects deleted
  through the fate primitive), or an idle wait with nobody working at the upper gave its turn
  up (nothing deleted: its descriptions stay StillPossible until the upper passes them);
* **Appended**: at least one description committed; the others that lost are listed. Each
  commit says whether this run's ``writer`` made it (this call, an earlier try of the same run,
  or its turn trigger: the shard log records the committing writer, so no second record is
  kept), and when. The descriptions of earlier attempts that gave their turn up
  (``superseded``) are then deleted where their fate lets them go.

Every decision comes from the fate (:mod:`shardsink.core.fate`), every deletion from the fate
primitive, and retries are the store's named policies: the caller (the Airflow task, the turn
trigger, the CLI) maps the outcome to succeed, defer or fail and does nothing else.
UnknownOutcomeError and FateUnknownError propagate (the caller retries the whole call, which
re-reads).

One description at a time (:func:`append_chain`, :func:`settle_manifests`, :func:`append_from_manifests`,
:func:`cleanup`): core settles it (:meth:`shardsink.core.shard.Shard.settle`); this module hands core
the description's claim and its verified manifests. Objects a description owns, all under the shard root:

* ``parts/<desc_id>/<uuid>.parquet``: staged parts (written by the Spark executors);
* ``staging/<desc_id>/slot-<i>.json``: the manifest of slot ``i``: the parts its
  successful write attempt staged, its row count and the source inputs it read
  (:class:`shardsink.core.manifests.ManifestDoc`, :mod:`shardsink.sinks.staging`).

Description ids are unique per attempt (a fresh one after every lost race), so a
prefix never mixes two descriptions, and whatever is under ``parts/<desc_id>/`` that
the committed batch does not reference is a leftover of a killed or retried write
attempt. Every deletion goes through :func:`shardsink.core.fate.delete_staged`, which
re-derives the description's fate from one state read before deleting anything.

SUBTLE (never delete on an unknown outcome): an UnknownOutcomeError propagates
untouched; the retry re-reads the state. A description that may still commit is never
cleaned up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shardsink.core.fate import CannotCommit, Committed, Fate, StillPossible, Unknown
from shardsink.core.settle import Claim, NotYet, Refused, Settled
from shardsink.core.shard import AppendResult, Shard
from shardsink.errors import CorruptionError, InvalidUsageError, ShardClosedError, ShardsinkError, UpperMismatchError
from shardsink.sinks.description import Description
from shardsink.sinks.waiting import at_upper, staged_descriptions, waits_behind

log = logging.getLogger("shardsink.sinks")


@dataclass(frozen=True, kw_only=True)
class Turn:
    """The wait of a chain minted ahead, as its caller has kept it across hand-backs: when it
    began (epoch s), how long it may last (``max_wait``), after how long without progress an
    idle wait gives its turn up (``catch_up_after``), and what the watcher last said (``idle``,
    ``timed_out``, ``behind``). ``dag_id`` names the runs it waits behind; ``now``: the clock."""

    since: float
    max_wait: float
    catch_up_after: float
    idle: bool = False
    timed_out: bool = False
    behind: str | None = None
    dag_id: str | None = None
    now: Callable[[], float] = field(default=time.time, compare=False)


@dataclass(frozen=True)
class Landed:
    """``desc`` committed (``result``); ``mine``: by this run's writer; ``at``: when (epoch s)."""

    desc: Description
    result: AppendResult
    mine: bool
    at: float


@dataclass(frozen=True)
class Missed:
    """``desc`` did not commit: the shard's upper was ``upper``; ``deleted``: its staged objects
    deleted (a lost race), or None (nothing deleted: it may still commit once its turn comes)."""

    desc: Description
    upper: int | None
    deleted: int | None

    def line(self) -> str:
        """Why, for the log and the append's report."""
        d = self.desc
        if self.deleted is not None:
            return (f"lost the race at shard upper {self.upper}: description {d.desc_id} [{d.lower}, {d.upper}) "
                    f"was not committed and its {self.deleted} staged objects were deleted")
        return (f"description {d.desc_id} [{d.lower}, {d.upper}) cannot commit now (shard upper {self.upper}); "
                "nothing was deleted (its staged parts go with GC once the upper passes it)")


@dataclass(frozen=True)
class Appended:
    landed: tuple[Landed, ...]
    missed: tuple[Missed, ...]
    upper: int | None


@dataclass(frozen=True)
class Waiting:
    """The chain's turn has not come: the upper is ``upper``, below ``desc.lower``. ``catch_up_after``:
    how long the watcher may see no progress before handing back as idle (None: someone works at
    the upper, so only ``max_wait`` ends the wait)."""

    desc: Description
    upper: int
    behind: str
    since: float
    catch_up_after: float | None


@dataclass(frozen=True)
class Lost:
    missed: tuple[Missed, ...]
    upper: int | None
    why: str
    gave_up: bool = False


@dataclass(frozen=True)
class Failed:
    why: str


AppendOutcome = Appended | Waiting | Lost | Failed


def append_run(shard: Shard, chain: Sequence[Description], slots: int, *, writer: str, turn: Turn | None = None,
               superseded: Sequence[Description] = ()) -> AppendOutcome:
    """Append ``chain`` in order, or say why not (module docstring). ``turn``: the wait so far of
    a chain minted ahead (None: a caller that never waits: a chain ahead of the upper is Waiting
    with no one named behind)."""
    if not chain:
        raise InvalidUsageError("append_run takes a chain of at least one description; nothing appended")
    landed: list[Landed] = []
    missed: list[Missed] = []
    upper: int | None = None
    try:
        for d, r in append_chain(shard, chain, slots, writer=writer):
            if isinstance(r, NotYet) and d is chain[0] and r.upper is not None:
                return _wait(shard, d, r.upper, turn)  # the first one's turn has not come: nothing was read for more
            if isinstance(r, AppendResult):
                upper = r.upper
                landed.append(Landed(d, r, r.status == "committed" or r.writer == writer, _epoch(r.at)))
                continue
            upper = r.current if isinstance(r, Refused) else r.upper
            missed.append(Missed(d, upper, r.deleted if isinstance(r, Refused) else None))
            log.info("%s", missed[-1].line())
    except (CorruptionError, ShardClosedError) as e:
        return Failed(str(e))
    if not landed:
        return Lost(tuple(missed), upper, missed[-1].line())
    _settle_superseded(shard, superseded)
    return Appended(tuple(landed), tuple(missed), upper)


def _epoch(at: str | None) -> float:
    return datetime.fromisoformat(at).timestamp() if at else time.time()


def _wait(shard: Shard, desc: Description, upper: int, turn: Turn | None) -> Waiting | Lost | Failed:
    """The chain's turn has not come: wait on, give the turn up, or fail (the module docstring)."""
    if turn is None:
        return Waiting(desc, upper, "", time.time(), None)
    now = turn.now()
    behind = turn.behind if turn.behind is not None else waits_behind(shard, upper, dag_id=turn.dag_id)
    what = f"description {desc.desc_id} [{desc.lower}, {desc.upper})"
    waited = now - turn.since
    if waited >= turn.max_wait or turn.timed_out:
        return Failed(
            f"{what} waited {waited:.0f}s (max_append_wait {turn.max_wait:.0f}s) for the shard's upper {upper} to "
            f"reach its lower; it waits behind {behind}. Nothing was deleted: its staged parts stay (still "
            "possible) until the upper passes its lower. Fix or clear the run it waits behind, then clear this task")
    catch_up: float | None = turn.catch_up_after
    if turn.idle:
        staged = staged_descriptions(shard)
        busy = [s for s in staged if s.lower < desc.lower and now - s.newest < turn.catch_up_after]
        if not at_upper(staged, upper) and not busy:
            why = (f"{what} gave its turn up: no progress at the shard's upper {upper} for "
                   f"{turn.catch_up_after:.0f}s and nothing staged there; nothing was deleted (the attempt that "
                   "catches up deletes its staged objects once it passes them)")
            return Lost((Missed(desc, upper, None),), upper, why, gave_up=True)
        catch_up = None  # someone works at or below the upper: wait for it (until max_wait)
    return Waiting(desc, upper, behind, turn.since, catch_up)


def _settle_superseded(shard: Shard, superseded: Sequence[Description]) -> None:
    """Delete what earlier attempts of the run staged ahead and gave their turn up on, now that
    this chain committed, through the fate primitive: only what can never commit goes; one still
    possible, or any failure, is left to GC and logged."""
    for d in superseded:
        try:
            gone = cleanup(shard, d)
        except ShardsinkError as e:  # DeleteRefusedError: still possible; else: GC's, later
            log.info("description %s (its turn given up) left to GC: %s", d.desc_id, e)
            continue
        log.info("description %s (its turn given up) can never commit: deleted its %d staged objects", d.desc_id,
                 gone)


# --- one description at a time ---------------------------------------------------------


class LostRaceError(UpperMismatchError):
    """The description lost compare-and-append; its staged objects were already deleted."""

    def __init__(self, message: str, *, expected: int, current: int | None, deleted: int) -> None:
        super().__init__(message, expected=expected, current=current)
        self.deleted = deleted


def next_in_chain(prev: AppendResult, desc: Description) -> Fate | None:
    """The fate of ``desc`` as of the version that committed ``prev``, the description before it in
    its chain: ``desc`` was minted to start where ``prev`` ends, and the version that committed
    ``prev`` sealed nothing past it, so ``desc`` may still commit there (no read). None if
    ``prev`` does not end at ``desc``'s lower (read the fate then)."""
    return StillPossible(prev.upper) if prev.upper == desc.lower else None


def cleanup(shard: Shard, desc: Description, *, decided: Committed | CannotCommit | Unknown | None = None) -> int:
    """Delete what ``desc`` staged and its fate lets go (:func:`shardsink.core.fate.delete_staged`):
    its manifests, and its parts unless its committed batch references them. Returns objects deleted.
    ``decided``: a final fate already decided from a state version (no second read).
    A description id (a ``str``) is refused: the lower the fate is decided at comes with the description.
    """
    if not isinstance(desc, Description):
        raise InvalidUsageError(f"cleanup takes the Description (its id and lower), not {type(desc).__name__} "
                                f"{desc!r:.120}; nothing deleted", value=repr(desc)[:120])
    return shard.writer().delete_staged(desc.desc_id, desc.lower, decided=decided).total


def settle_manifests(shard: Shard, desc: Description, slots: int, *, writer: str | None = None,
                     fate: Fate | None = None) -> Settled:
    """Commit ``desc`` from its ``slots`` verified manifests, or say why not: :meth:`Shard.settle`
    (committed or already committed, Refused with its staged objects deleted, NotYet), with the
    manifests read only when it may commit now. ``fate``: as decided by the caller from a version
    it holds (:func:`next_in_chain`), else one fresh read. Hooks ``append.before_commit`` and
    ``append.committed`` fire around the conditional put."""
    return shard.settle(Claim(desc_id=desc.desc_id, lower=desc.lower, upper=desc.upper, slots=slots, writer=writer,
                              listing=desc.listing, attempt=desc.attempt), decided=fate)


def append_from_manifests(shard: Shard, desc: Description, slots: int, *, writer: str | None = None,
                          fate: Fate | None = None) -> AppendResult:
    """:func:`settle_manifests` as a call that commits or raises: ``committed`` or
    ``already_committed`` (a retried task, or its twin still running, landed it); LostRaceError
    (its staged objects deleted; the shard's current upper) if it can never commit;
    UpperMismatchError (nothing deleted) if its turn has not come. UnknownOutcomeError,
    FateUnknownError and CorruptionError propagate with nothing deleted.

    SUBTLE (twin appends: Airflow retries this task while its first try still runs): every
    decision comes from ONE state read, and every deletion re-derives it
    (:func:`shardsink.core.fate.delete_staged`); :mod:`shardsink.core.settle` says how.
    """
    got = settle_manifests(shard, desc, slots, writer=writer, fate=fate)
    if isinstance(got, AppendResult):
        return got
    raise missed_error(shard.url, desc, got)


def missed_error(url: str, desc: Description, missed: Refused | NotYet) -> UpperMismatchError:
    """The error that says why ``desc`` did not commit: LostRaceError once its staged objects were
    deleted (a fresh description is needed), UpperMismatchError while it may still commit."""
    what = f"description {desc.desc_id} [{desc.lower}, {desc.upper})"
    if isinstance(missed, NotYet):
        return UpperMismatchError(
            f"{what} starts above the upper {missed.upper} of {url}: its turn has not come (an earlier interval "
            "is not committed yet); it was not committed and nothing was deleted (it may still commit once the "
            "upper reaches its lower)", expected=desc.lower, current=missed.upper)
    return LostRaceError(
        f"lost the race on {url}: shard upper is {missed.current}, not {desc.lower}; {what} was not committed; "
        f"deleted its {missed.deleted} staged objects; a fresh description is needed (clear the whole DAG run, "
        "not just this task)", expected=desc.lower, current=missed.current, deleted=missed.deleted)


def append_chain(shard: Shard, chain: Sequence[Description], slots: int, *, writer: str | None = None,
                 first: Fate | None = None) -> Iterator[tuple[Description, Settled]]:
    """Settle a mint's chain in order (:func:`settle_manifests`; a correcting description has one
    manifest slot), yielding each description with how it settled; the next one still commits if
    its lower is the upper. A description that follows one just committed takes its fate from that
    commit's version (:func:`next_in_chain`): no read. ``first``: the first description's fate as
    the caller already read it. Errors propagate.
    """
    prev: AppendResult | None = None
    for i, d in enumerate(chain):
        fate = next_in_chain(prev, d) if prev is not None else (first if i == 0 else None)
        got = settle_manifests(shard, d, 1 if d.corrects else slots, writer=writer, fate=fate)
        prev = got if isinstance(got, AppendResult) else None
        yield d, got
