"""The ingest sink's driver steps before the append, as plain library calls, independent of Airflow.

::

    mint_chain(shard, source, ...)        -> [Description, ...] | NoOp   (one chain per attempt)
    write_manifest(shard, desc, slot, ...)                               (once per writer slot,
                                                                          :mod:`shardsink.sinks.staging`)
    append_chain(shard, chain, n)                                        (:mod:`shardsink.sinks.append`)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from shardsink.core import checks as ck
from shardsink.core.fate import Committed, Unknown, unknown_fate_error
from shardsink.core.shard import Shard, ShardInfo
from shardsink.core.state import Version
from shardsink.errors import InvalidUsageError, ShardNotFoundError
from shardsink.reclock.source import Reclocked, reclocked_upper
from shardsink.sinks.description import Description, NoOp, make_desc_id
from shardsink.sinks.seals import seals
from shardsink.sources.base import Seal, Sealing, Source

log = logging.getLogger("shardsink.sinks")


def open_or_create(shard_url: str, source: Source, *, initial_upper: int) -> Shard:
    """Open the shard, creating it from the source's schema at ``initial_upper`` if missing.

    Two runs may race to create it; the loser opens the winner's shard.
    """
    try:
        return Shard.open(shard_url)
    except ShardNotFoundError:
        return _create(shard_url, source, initial_upper=initial_upper)


def _create(shard_url: str, source: Source, *, initial_upper: int) -> Shard:
    """Create the missing shard from the source's schema (or open the winner's of a race to create it)."""
    from shardsink.errors import ShardExistsError

    schema = source.schema()
    if schema is None:
        raise InvalidUsageError(
            f"shard {shard_url} does not exist and source {source.spec()} has no data or declared "
            "columns to create it from; declare the source's columns or create the shard"
        ) from None
    try:
        return Shard.create(shard_url, schema, upper=initial_upper)
    except ShardExistsError:
        return Shard.open(shard_url)


def open_with_info(shard_url: str, source: Source, *, initial_upper: int) -> tuple[Shard, ShardInfo]:
    """:func:`open_or_create` and the shard's head, read ONCE (a mint's one head read when the
    shard exists); the task hands the :class:`ShardInfo` down instead of reading it again."""
    shard = Shard(shard_url)
    try:
        return shard, shard.info()
    except ShardNotFoundError:
        shard = _create(shard_url, source, initial_upper=initial_upper)
        return shard, shard.info()


@dataclass(frozen=True)
class Seen:
    """What a mint task already read, once: the shard's head and the source's watermark
    (:func:`read_watermark`). :func:`mint_chain` decides from these instead of reading again."""

    info: ShardInfo
    watermark: int | None


def source_progress(shard: Shard, source: Source, *, lower: int | None, interval_end: int | None,
                    max_span: int | None, seen: Seen | None = None) -> int | None:
    """What the source has complete below, as a shard time: an event-time source's watermark
    (``seen.watermark`` if the caller read it already); for a reclocked source (offsets, not event
    times) the time its offsets are bound through, minting the binding for the run's target if
    needed (:func:`shardsink.reclock.source.reclocked_upper`)."""
    if isinstance(source, Reclocked) and lower is not None:
        return reclocked_upper(source, shard_url=shard.url, lower=lower, interval_end=interval_end, max_span=max_span)
    return seen.watermark if seen is not None else read_watermark(source)


def read_watermark(source: Source) -> int | None:
    """The source's watermark (one read), checked and clamped to the times a shard can hold."""
    wm = source.watermark()
    if wm is None:
        return None
    # A source's watermark is input too: an integer; no shard upper can pass int64's largest time.
    if not ck.is_int(wm):
        raise InvalidUsageError(f"source {source.kind} reported watermark {wm!r}; expected integer milliseconds")
    return max(0, min(wm, ck.TIME_MAX))


def mint_chain(
    shard: Shard,
    source: Source,
    *,
    interval_end: int | None,
    max_span: int | None,
    max_chain: int,
    dag_id: str,
    run_id: str,
    attempt: int,
    corrects: tuple[int, int] | None = None,
    seen: Seen | None = None,
    prepare: bool = True,
    ahead_from: int | None = None,
) -> list[Description] | NoOp:
    """The consecutive descriptions that bring the shard's upper to the run's **target**
    ``min(watermark, interval end)``: ``[u0, u1), [u1, u2), ...`` from the shard's upper,
    each at most ``max_span`` wide, at most ``max_chain`` of them (the caller mints again
    for the rest).

    With ``corrects`` (re-processing the sealed range ``[A, B)``) the chain is never empty
    while the watermark is past the upper: its first description carries the correction and
    spans at least ``[upper, min(watermark, upper + max_span))`` even if the run's own
    interval is already covered (the correction needs a time of its own, and the source's
    rows at those times are ingested in the same description so none is skipped).
    NoOp (with a reason naming all inputs) when there is nothing to write. ``seen``: the shard's
    head and the source's watermark as the caller already read them (else read here, once each).
    A source with ``prepare_chain(shard_url, descriptions) -> [Listing, ...]`` is called with the
    chain minted, before it is returned (the landing zone lists once and writes each description's
    file plan); each description is returned carrying its :class:`~shardsink.core.commits.Listing`;
    ``prepare=False`` (a dry run, which writes nothing) skips that.

    ``ahead_from`` (**mint ahead**, a backfill's later interval): when past the shard's upper, the
    chain starts there instead, and its descriptions commit once the upper reaches their lower
    (the append waits its turn). The caller checks the source covers the interval; never with
    ``corrects`` (a correction lands at the upper) nor for a reclocked source (its bindings are
    minted from the upper). At or below the upper it is ignored: the caught-up mint is the same
    chain with ``ahead_from`` = the upper.
    """
    if max_chain < 1:
        raise InvalidUsageError(f"max_chain {max_chain} must be at least 1")
    lower = seen.info.upper if seen is not None else shard.info().upper
    if ahead_from is not None and lower is not None and ahead_from > lower:
        if corrects is not None or isinstance(source, Reclocked):
            raise InvalidUsageError(f"cannot mint ahead from {ahead_from} (shard upper {lower}) "
                                    f"{'with a correction' if corrects else 'for a reclocked source'}; nothing minted",
                                    value=str(ahead_from))
        ck.check_time(ahead_from, what="ahead_from")
        lower = ahead_from
    wm = source_progress(shard, source, lower=lower, interval_end=interval_end, max_span=max_span, seen=seen)
    if lower is None:
        return NoOp(f"shard {shard.url} is closed; nothing can be appended", None, wm, interval_end)
    end = lower if wm is None else min(b for b in (wm, interval_end) if b is not None)
    if corrects is not None and wm is not None:
        end = max(end, wm if max_span is None else min(wm, lower + max_span))
    out: list[Description] = []
    cur = lower
    while cur < end and len(out) < max_chain:
        nxt = end if max_span is None else min(end, cur + max_span)
        out.append(Description(make_desc_id(dag_id, run_id, attempt), cur, nxt, attempt,
                               corrects if not out else None))
        cur = nxt
    if not out:
        why = "the source has published no watermark yet" if wm is None else "nothing new is complete"
        if corrects is not None and wm is not None:
            why = "the source's watermark is not past the shard's upper, so a correction has no time to land at"
        return NoOp(
            f"nothing to do: {why} (shard upper {lower}, watermark {wm}, interval end {interval_end}, "
            f"max span {max_span})",
            lower, wm, interval_end,
        )
    plan = getattr(source, "prepare_chain", None) if prepare else None
    if plan is not None:  # a source that plans its descriptions' reads (the landing zone's file plans)
        listings = plan(shard.url, out, sealing=_sealing(shard, seen))
        # Each description carries the listing its plan was made from to its commit (it seals
        # its times as of that listing: shardsink.sinks.seals).
        out = [msgspec.structs.replace(d, listing=li) for d, li in zip(out, listings, strict=True)]
    return out


def _sealing(shard: Shard, seen: Seen | None) -> Sealing:
    """What the shard had sealed as the mint read it: its upper, and its seals read on demand
    (:func:`shardsink.sinks.seals.seals`) from the head the mint read, fetched by its seqno (no
    second head read; a fresh head if the caller read none or GC took it meanwhile), back only
    as far as the earliest time asked for: the cost follows the files to judge, not history."""
    info = seen.info if seen is not None else shard.info()

    def seals_from(t: int) -> list[Seal]:
        return seals(shard, head=shard.reader().version(info.seqno), down_to=t)

    return Sealing(info.upper, seals_from)


# --- committed state ------------------------------------------------------------------


def committed(shard: Shard, desc: Description, *, head: Version | None = None) -> Committed | None:
    """The commit of ``desc`` if it landed: the Committed fate (see :mod:`shardsink.core.fate`);
    None if it did not or may still; FateUnknownError if the evidence is older than the retained
    history. ``head``: a version the caller already read, else one fresh read."""
    f = shard.writer().fate(desc.desc_id, desc.lower, head=head)
    if isinstance(f, Unknown):
        raise unknown_fate_error(shard.url, desc.desc_id, desc.lower, desc.upper, f)
    return f if isinstance(f, Committed) else None
