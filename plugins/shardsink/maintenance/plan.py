"""Which batches to merge: size-tiered levels over the live batch list (pure).

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

Batches holding re-processing corrections (parts under ``parts/<desc>/corrects-A_B/``,
see :mod:`shardsink.sinks.reprocess`) are never merged: re-processing finds earlier
corrections of a range by that key label, and a merge would erase it (a re-run would
then apply the same correction twice). They are barriers: groups never span them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardsink.core.state import BatchMeta
from shardsink.errors import InvalidUsageError


@dataclass(frozen=True)
class PlanOptions:
    """``fan_in``: how many equal-level batches make the next level (>= 2);
    ``max_batches``: merge at most this many batches in one compaction (a bound on the
    inputs one merge opens; leftovers are merged by a later run); ``min_rows``: batches
    smaller than ``fan_in * min_rows`` rows are all level 0 (each pass rewrites at most
    about that many rows of them)."""

    fan_in: int = 2
    max_batches: int = 1024
    min_rows: int = 1024


#: The key segment of re-processing corrections' parts (``shardsink.sinks.reprocess.correction_label``).
CORRECTION_SEGMENT = "/corrects-"


def holds_corrections(b: BatchMeta) -> bool:
    """Whether ``b`` holds re-processing correction parts (kept apart by every plan)."""
    return any(CORRECTION_SEGMENT in p.key for p in b.parts)


def level(rows: int, fan_in: int, min_rows: int = 1) -> int:
    """``floor(log_fan_in(rows // min_rows))`` (0 below ``fan_in * min_rows`` rows), in integers."""
    n, lv = max(1, rows // max(1, min_rows)), 0
    while n >= fan_in:
        n //= fan_in
        lv += 1
    return lv


def plan_merges(batches: Sequence[BatchMeta], options: PlanOptions = PlanOptions()) -> list[tuple[BatchMeta, ...]]:
    """Runs of adjacent batches to merge (each of >= 2 batches, or one unordered batch), oldest first."""
    if options.fan_in < 2 or options.max_batches < 2 or options.min_rows < 1:
        raise InvalidUsageError(f"plan options {options} are invalid: fan_in and max_batches must be at least 2, "
                                "min_rows at least 1")
    stack: list[tuple[list[BatchMeta], int]] = []  # (group, rows)
    done: list[tuple[BatchMeta, ...]] = []
    for b in batches:
        if holds_corrections(b):  # a barrier: flush the groups before it, merge nothing across it
            done += [tuple(g) for g, _ in stack if _worth_merging(g)]
            stack = []
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
