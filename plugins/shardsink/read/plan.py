"""What an engine reader reads: one leased, pinned plan of parts, time bounds and columns.

:func:`open_plan` is the ONE place that decides, for a snapshot or a change feed, which
parts of which state version an engine (DuckDB, Polars) scans, which columns it takes from
each part, and which time filter applies. The engines only translate a :class:`ReadPlan`
into their own scan + filter + ``GROUP BY``; so a later change to what a part holds
(schema evolution: a per-part projection) is made here, once, for every engine.

**Schema evolution.** Every part is read through :func:`shardsink.core.schema.projection_for`
from the schema id its batch was written with onto the reader schema
``ReadHandle.reader_schema(header, schema, t)``, exactly as the pyarrow reads: ``"current"``
(default) the shard's schema now; ``"as_of"`` the one current at the read's time ``t``
(snapshot: ``as_of``; changes: ``max(lower, upper - 1)``). By field id: renamed columns from
their old name (as_of: a column renamed later keeps its old name), added ones as typed nulls
(as_of: columns added later are absent), widened ones cast (as_of: to the older, narrower
type), dropped ones not read (as_of: a column dropped later is present; parts rewritten by a
compaction after the drop no longer hold it and read it as nulls, as the pyarrow read does).
Engines scan each group of parts sharing a projection (:meth:`ReadPlan.groups`) and union them.

The semantics are exactly those of :meth:`shardsink.core.read.ReadHandle.snapshot` and
:meth:`~shardsink.core.read.ReadHandle.changes`:

* snapshot at ``as_of`` (default ``upper - 1``; ``since <= as_of < upper``): the updates
  with ``_time <= as_of``, summed per row into ``_count``; rows with ``_count == 0`` are
  dropped and a negative ``_count`` is corruption;
* changes ``[lower, upper)`` (``since <= lower <= upper <= shard upper``): the updates with
  ``lower <= _time < upper``, times below ``since`` read as ``since`` (only possible when
  ``lower == since``: the feed starts with the history compacted into ``since``), summed
  per ``(row, _time)``, zero sums dropped.

**Leases.** The plan is taken under a read lease (:mod:`shardsink.core.leases`) at ``as_of``
(changes: at ``lower``), and its parts come from the version read *after* the lease was
written (``acquire_pinned``): GC keeps every part of that version while the lease lives.
The :class:`Lease` renews it from a daemon thread until :meth:`Lease.close`.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from shardsink.core import checks as ck
from shardsink.core import schema as sch
from shardsink.core.leases import DEFAULT_TTL_S, LeaseKeeper
from shardsink.core.read import ReadHandle, SchemaChoice
from shardsink.core.schema import ColumnProjection
from shardsink.core.shard import Shard, default_writer
from shardsink.core.state import BatchMeta, Header, PartMeta, SchemaEntry, Version
from shardsink.errors import CorruptionError, InvalidUsageError, LeaseLostError, ReadFrontierError

log = logging.getLogger(__name__)

Mode = Literal["snapshot", "changes"]
SCHEMA_CHOICES: tuple[SchemaChoice, ...] = ("current", "as_of")


def check_schema_choice(schema: object) -> SchemaChoice:
    """``schema`` if it is a schema choice (``"current"`` or ``"as_of"``), else InvalidUsageError naming it."""
    if not isinstance(schema, str) or schema not in SCHEMA_CHOICES:
        raise InvalidUsageError(f"schema {schema!r:.120} is not a schema choice; expected 'current' or 'as_of'",
                                value=str(schema)[:120])
    return "current" if schema == "current" else "as_of"


@dataclass(frozen=True, kw_only=True)
class PartRead:
    """One part to scan and how to read its user columns as the plan's (``projection``: one
    entry per plan column, in order: the part's column to read, or None for typed nulls; the
    type to cast to). ``columns``: the plan's column names; ``source``: the part's Parquet
    schema of its user columns (the schema id it was written with).

    SUBTLE: a part written under an older schema lacks a column or names it differently;
    engines must take the projection from this record, never from the part file."""

    part: PartMeta
    columns: tuple[str, ...]
    projection: tuple[ColumnProjection, ...] = ()
    source: pa.Schema | None = None
    schema_id: int = 0


@dataclass(frozen=True, kw_only=True)
class ReadPlan:
    """A snapshot or change feed of ``url`` as of the pinned state version ``seqno``.

    ``schema``: the user columns of the result (without ``_time``/``_diff``/``_count``).
    ``lower``/``upper``: the half-open time range ``[lower, upper)`` of the updates to read
    (snapshot: ``lower`` is None and ``upper = as_of + 1``). ``since``: times below it read
    as ``since`` when ``advance`` (changes from ``since`` only). ``filter_lower`` /
    ``filter_upper``: whether the engine must filter on that bound at all (False when no
    planned part holds a time outside it, so the scan needs no filter).
    """

    url: str
    mode: Mode
    seqno: int
    schema: pa.Schema
    parts: tuple[PartRead, ...]
    lower: int | None
    upper: int
    since: int
    advance: bool
    filter_lower: bool
    filter_upper: bool

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def groups(self) -> list[tuple[PartRead, tuple[PartMeta, ...]]]:
        """The parts grouped by the schema id they were written with and whether they store
        ``_diff`` (one scan each: a group's files share their columns), in first-seen order: a
        representative :class:`PartRead` and the group's parts. SUBTLE: a group whose parts'
        diffs are implicit (:attr:`PartMeta.implicit_diffs`) has no ``_diff`` column to scan;
        the engine supplies the constant 1."""
        out: dict[tuple[int, bool], list[PartRead]] = {}
        for r in self.parts:
            out.setdefault((r.schema_id, r.part.implicit_diffs), []).append(r)
        return [(rs[0], tuple(r.part for r in rs)) for rs in out.values()]

    @property
    def as_of(self) -> int:
        """The snapshot's ``as_of`` (``upper - 1``)."""
        return self.upper - 1

    @property
    def empty(self) -> bool:
        """Nothing can be in the result (no parts, or an empty change range)."""
        return not self.parts or (self.lower is not None and self.lower >= self.upper)

    def describe(self) -> str:
        what = f"as of {self.as_of}" if self.mode == "snapshot" else f"changes [{self.lower}, {self.upper})"
        return f"shard {self.url} {what} (state {self.seqno})"


def snapshot_parts(batches: tuple[BatchMeta, ...], as_of: int) -> list[PartMeta]:
    """The parts that may hold updates with ``_time <= as_of`` (as ReadHandle.snapshot)."""
    return [p for b in batches if b.lower <= as_of for p in b.parts if p.min_time <= as_of]


def changes_parts(batches: tuple[BatchMeta, ...], lower: int, upper: int, *, from_start: bool) -> list[PartMeta]:
    """The parts that may hold updates in ``[lower, upper)`` (as ReadHandle.changes): with
    ``from_start`` every part below ``upper`` (its times may read as ``since``)."""
    return [p for b in batches for p in b.parts if (from_start or p.max_time >= lower) and p.min_time < upper]


def plan_for(shard: Shard, v: Version, mode: Mode, *, as_of: int | None = None,
             changes: tuple[int, int] | None = None, schema: SchemaChoice = "current") -> ReadPlan:
    """The plan of ``mode`` on the state version ``v`` (checked against ``v``'s frontiers),
    its columns those of the ``schema`` choice (module docstring)."""
    h = v.header
    batches = shard.reader().batches(v)
    if mode == "snapshot":
        assert as_of is not None
        ck.check_as_of(shard.url, h, as_of)
        parts = snapshot_parts(batches, as_of)
        lower, upper, advance = None, as_of + 1, False
        filter_lower, filter_upper = False, any(p.max_time > as_of for p in parts)
    else:
        assert changes is not None
        lower, upper = changes
        ck.check_changes(shard.url, h, lower, upper)
        advance = lower <= h.since
        parts = changes_parts(batches, lower, upper, from_start=advance)
        advance = advance and any(p.min_time < h.since for p in parts)
        # Advanced times are >= since == lower: only a part below lower without advancing needs that bound.
        filter_lower = not advance and any(p.min_time < lower for p in parts)
        filter_upper = any(p.max_time >= upper for p in parts)
    # The read's time as ReadHandle.snapshot / changes take it (changes: max(lower, upper - 1)).
    target = ReadHandle.reader_schema(h, check_schema_choice(schema), upper - 1 if lower is None else
                                      max(lower, upper - 1))
    user = sch.entry_schema(target)
    ids = {p.key: b.schema_id for b in batches for p in b.parts}
    reads = tuple(_part_read(shard.url, h, p, ids[p.key], target) for p in parts)
    return ReadPlan(url=shard.url, mode=mode, seqno=v.seqno, schema=user, parts=reads, lower=lower, upper=upper,
                    since=h.since, advance=advance, filter_lower=filter_lower, filter_upper=filter_upper)


def _part_read(url: str, h: Header, part: PartMeta, schema_id: int, target: SchemaEntry) -> PartRead:
    source = sch.entry(h, schema_id)
    if source is None:
        raise CorruptionError(f"shard {url}: part {part.key} was written with schema id {schema_id}, which the "
                              f"shard's schema history {[e.id for e in sch.history(h)]} does not hold")
    proj = sch.projection_for(source, target)
    return PartRead(part=part, columns=tuple(c.name for c in proj), projection=proj,
                    source=sch.entry_schema(source), schema_id=schema_id)


class Lease:
    """A read lease held for an engine's relation or frame; renewed until :meth:`close`.

    ``close`` is idempotent; it raises LeaseLostError if the lease was lost on the way (the
    read may not have been protected). :meth:`tie` releases it when an object is
    garbage-collected (then a loss is only logged: there is no caller to raise to).
    """

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper
        self._finalizer: weakref.finalize[[LeaseKeeper], Any] | None = None

    def tie(self, obj: object) -> None:
        """Release the lease when ``obj`` is garbage-collected (if not closed before)."""
        self._finalizer = weakref.finalize(obj, _close_quietly, self._keeper)

    @property
    def held(self) -> bool:
        return bool(self._keeper.leases())

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self._keeper.close()


def _close_quietly(keeper: LeaseKeeper) -> None:
    try:
        keeper.close()
    except LeaseLostError as e:
        log.warning("a shardsink read lease was lost before its reader was collected: %s", e)
    except Exception as e:  # a finaliser must not raise
        log.warning("releasing a shardsink read lease failed (it will expire): %s", e)


def open_plan(url: str, mode: Mode, *, as_of: int | None = None, changes: tuple[int, int] | None = None,
              holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
              schema: SchemaChoice = "current") -> tuple[ReadPlan, Lease]:
    """Take a lease and plan the read from the version pinned after it (module docstring).

    Refuses (InvalidUsageError / ReadFrontierError, no lease left behind) a bad ``schema``
    choice, bad bounds, an ``as_of`` outside ``[since, upper)`` and a change range outside
    ``[since, upper]``.
    """
    schema = check_schema_choice(schema)
    if holder is not None and (not isinstance(holder, str) or not holder):
        raise InvalidUsageError(f"lease holder {holder!r} must be a non-empty string")
    shard = Shard(url)
    v = shard.reader().head()
    h = v.header
    if mode == "snapshot":
        if changes is not None:
            raise InvalidUsageError("pass either as_of (a snapshot) or changes=(lower, upper), not both")
        if as_of is None:
            if h.upper is None:
                raise ReadFrontierError(f"shard {shard.url} is closed; pass an explicit as_of")
            as_of = h.upper - 1
        lease_at = ck.check_as_of(shard.url, h, as_of)
    else:
        if not isinstance(changes, tuple) or len(changes) != 2:
            raise InvalidUsageError(f"changes={changes!r} must be a (lower, upper) pair of times")
        ck.check_changes(shard.url, h, *changes)
        lease_at = changes[0]
    keeper = LeaseKeeper(ttl_s=ttl_s)
    try:
        pinned = keeper.acquire_pinned(shard, lease_at, holder=holder or f"engine-read@{default_writer()}",
                                       head=v)[1]
        plan = plan_for(shard, pinned, mode, as_of=as_of, changes=changes, schema=schema)
    except BaseException:
        keeper.close()
        raise
    return plan, Lease(keeper)
