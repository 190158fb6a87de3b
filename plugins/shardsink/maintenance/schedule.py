"""The maintenance schedule: which batches to merge, by size-tiered levels over the live batch list (pure).

As in persist's Spine, a batch's level is ``floor(log_F(rows / min_rows))`` for fan-in
``F`` (0 below ``min_rows``: small batches are all alike, so one pass merges every fresh
small batch into one instead of a binary decomposition of them).
Walking the batches oldest first with a stack of groups, a group is merged into the one
below it while the lower group's level is not above its own. Afterwards the levels of
the groups strictly decrease from oldest to newest, so there are at most
``log_F(total rows) + 1`` of them: live batches stay logarithmic in the number of
appends, and each row is rewritten about ``log_F`` times over the shard's life.
Only groups of two or more batches are merges to run, and a lone batch with unordered
parts (the fast ingest path, :data:`shardsink.core.state.PartOrder`): compaction is what
sorts and consolidates them.

Batches holding re-processing corrections (parts whose record names the range they correct,
:meth:`shardsink.core.state.PartMeta.corrected_range`; see :mod:`shardsink.sinks.reprocess`)
are never merged: re-processing finds earlier corrections of a range by that record, and a
merged part records none (a re-run would then apply the same correction twice). They are
barriers: groups never span them.

**Dropped columns still visible** (schema evolution, :mod:`shardsink.core.schema`): a merge
writes the newest schema, which lacks a dropped column, but an ``as_of`` read at a time
``since <= t < U`` (``U``: the upper at which the drop became current) still shows it. A batch
written under a schema holding such a field id, with rows a readable time can see (its lower
below ``U``), is **kept out** (:func:`visible_drops`): rewriting it into the newest schema
would change what those reads return. Kept-out batches are barriers too, but adjacent ones
still showing the same dropped fields may merge among themselves, into the newest of their
own schemas (:func:`merge_target`: it holds those fields, nothing is lost). Once ``since``
reaches ``U`` no readable time shows the field, the batch is compactable again, and the
column's data goes with its next merge. Renames, widenings and
added columns need no such care: reads map by field id, and an older, narrower ``as_of``
schema filters rows by time before casting (values written after a widening are never cast
back). Without a ``header`` the schedule cannot know the history: callers must pass it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from shardsink.core import schema as sch
from shardsink.core.state import BatchMeta, FieldSpec, Header, SchemaEntry
from shardsink.errors import CorruptionError, InvalidUsageError


@dataclass(frozen=True)
class ScheduleOptions:
    """``fan_in``: how many equal-level batches make the next level (>= 2);
    ``max_batches``: merge at most this many batches in one compaction (a bound on the
    inputs one merge opens; leftovers are merged by a later run); ``min_rows``: batches
    smaller than ``fan_in * min_rows`` rows are all level 0 (each pass rewrites at most
    about that many rows of them)."""

    fan_in: int = 2
    max_batches: int = 1024
    min_rows: int = 1024


def holds_corrections(b: BatchMeta) -> bool:
    """Whether ``b`` holds re-processing correction parts (kept apart by every schedule)."""
    return any(p.corrected_range() is not None for p in b.parts)


def level(rows: int, fan_in: int, min_rows: int = 1) -> int:
    """``floor(log_fan_in(rows // min_rows))`` (0 below ``fan_in * min_rows`` rows), in integers."""
    n, lv = max(1, rows // max(1, min_rows)), 0
    while n >= fan_in:
        n //= fan_in
        lv += 1
    return lv


def _reachable(header: Header, at: int) -> tuple[SchemaEntry, ...]:
    """Every schema :func:`shardsink.core.schema.as_of` gives at some time ``>= at``, and the current
    one (``schema="current"`` reads). A superset if uppers were ever out of order: safe here."""
    hist = sch.history(header)
    first = hist.index(sch.as_of(header, at))
    stop = next((i for i in range(first + 1, len(hist)) if hist[i].upper is None), len(hist))
    return (*hist[first:stop], sch.current(header))


def _dropped_at(header: Header, field_id: int) -> int | None:
    """The upper at which ``field_id`` left the schema (None: never current, e.g. a closed shard's)."""
    hist = sch.history(header)
    for before, e in itertools.pairwise(hist):
        if any(f.id == field_id for f in before.fields) and all(f.id != field_id for f in e.fields):
            return e.upper
    return None


def visible_drops(header: Header, b: BatchMeta, since: int) -> tuple[FieldSpec, ...]:
    """The fields of ``b``'s schema that the newest schema lacks but a read at a time
    ``>= since`` can still show among ``b``'s rows (its times are ``>= b.lower``): what a merge
    into the newest schema would delete while some reader can see it. A schema id the state
    does not know yields every field (unknown: keep it out; the merge reports the corruption)."""
    src = sch.entry(header, b.schema_id)
    if src is None:
        return sch.current(header).fields
    newest = {f.id for f in sch.current(header).fields}
    gone = [f for f in src.fields if f.id not in newest]
    if not gone:
        return ()
    seen = {f.id for e in _reachable(header, max(since, b.lower)) for f in e.fields}
    return tuple(f for f in gone if f.id in seen)


def merge_target(header: Header, inputs: Sequence[BatchMeta], since: int) -> SchemaEntry:
    """The schema a merge of ``inputs`` at ``since`` writes: the newest one, unless an input holds
    a dropped column a readable time still shows (:func:`visible_drops`); then the newest of
    the inputs' own schemas, if it holds every such column. Lossless: an input's other visible
    fields are the newest schema's, and a field id never comes back once dropped, so every
    schema from the input's to the newest holds them (types only widen on the way). Otherwise
    InvalidUsageError naming the batches, the column and when they become compactable; nothing
    is written. CorruptionError if an input names a schema id the state does not hold."""
    hist = sch.history(header)
    pos = {e.id: i for i, e in enumerate(hist)}
    for b in inputs:
        if b.schema_id not in pos:
            raise CorruptionError(f"batch {b.desc_id} names schema id {b.schema_id}, which the state does not hold "
                                  f"(it holds {[e.id for e in hist]})")
    held = [(b, f) for b in inputs for f in visible_drops(header, b, since)]
    if not held:
        return sch.current(header)
    target = hist[max(pos[b.schema_id] for b in inputs)]
    ids = {f.id for f in target.fields}
    missing = [(b, f) for b, f in held if f.id not in ids]
    if not missing:
        return target
    b, f = missing[0]
    upper = _dropped_at(header, f.id)
    raise InvalidUsageError(
        f"cannot compact batches {[x.desc_id for x in inputs]} at since {since}: batch {b.desc_id} holds column "
        f"{f.name!r} (field id {f.id}), dropped at upper {upper}, which as_of reads at times from {since} still "
        f"show; merging it into the newest schema would delete it. Compact it once since reaches {upper}, or "
        "only with batches still showing the same dropped columns", value=b.desc_id)


def _kind(b: BatchMeta, header: Header | None, since: int) -> frozenset[int]:
    """What a batch may merge with: batches of the same kind. Empty: it shows no dropped
    column (merges into the newest schema); else the ids of the dropped fields it still shows
    (kept out: merges only with batches showing exactly those, :func:`merge_target`)."""
    return frozenset(f.id for f in visible_drops(header, b, since)) if header is not None else frozenset()


def schedule_merges(batches: Sequence[BatchMeta], options: ScheduleOptions = ScheduleOptions(), *,
                header: Header | None = None, since: int | None = None) -> list[tuple[BatchMeta, ...]]:
    """Runs of adjacent batches to merge (each of >= 2 batches, or one unordered batch), oldest first.

    ``header``: the state the batches were read from (its schema history decides which batches
    are kept out, module docstring); ``since``: the since the merges consolidate at (default
    ``header.since``). HAZARD: without ``header`` nothing is kept out, which deletes a dropped
    column's data still visible to ``as_of`` reads if the shard dropped one after ``since``.
    Every run is one kind (:func:`merge_target` accepts it)."""
    if options.fan_in < 2 or options.max_batches < 2 or options.min_rows < 1:
        raise InvalidUsageError(f"schedule options {options} are invalid: fan_in and max_batches must be at least 2, "
                                "min_rows at least 1")
    at = since if since is not None else header.since if header is not None else 0
    stack: list[tuple[list[BatchMeta], int]] = []  # (group, rows)
    done: list[tuple[BatchMeta, ...]] = []
    kind: frozenset[int] = frozenset()  # the kind of the batches on the stack
    for b in batches:
        k = _kind(b, header, at)
        if holds_corrections(b) or k != kind:  # a barrier: flush the groups before it, merge nothing across it
            done += [tuple(g) for g, _ in stack if _worth_merging(g)]
            stack, kind = [], k
            if holds_corrections(b):
                continue
        stack.append(([b], b.rows))
        while len(stack) >= 2:
            (below, rb), (top, rt) = stack[-2], stack[-1]
            lb, lt = level(rb, options.fan_in, options.min_rows), level(rt, options.fan_in, options.min_rows)
            if lb > lt or len(below) + len(top) > options.max_batches:
                break
            stack[-2:] = [(below + top, rb + rt)]
    return done + [tuple(g) for g, _ in stack if _worth_merging(g)]


def _worth_merging(group: Sequence[BatchMeta]) -> bool:
    """Two or more batches, or one whose parts are not all sorted (its merge sorts them)."""
    return len(group) >= 2 or any(b.order != "sorted" for b in group)
