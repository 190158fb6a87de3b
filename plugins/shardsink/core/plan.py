"""The one read planner: which parts of which state version a read loads, how its times prune
them, which schema every part is projected onto, and where the read's lease is held.

Every reader asks it and no other module decides any of this: the pyarrow reads
(:meth:`shardsink.core.read.ReadHandle.snapshot` / ``changes``), DuckDB and Polars
(:mod:`shardsink.read`), the Spark data source (:mod:`shardsink.spark.datasource`) and Spark's
native planning (:mod:`shardsink.spark.read`, :mod:`shardsink.spark.native_read`). The engines
only translate a :class:`ReadPlan` into their own scan, filter and sum, as pyiceberg's
``plan_files()`` feeds each of its ``to_*`` readers.

**A read** (:class:`Bounds`, :meth:`Bounds.resolve`, frontiers checked on the version the
caller read):

* snapshot at ``as_of`` (default ``upper - 1``; ``since <= as_of < upper``): the updates with
  ``_time <= as_of``, summed per row into ``_count``; rows with ``_count == 0`` are dropped and a
  negative ``_count`` is corruption;
* changes ``[lower, upper)`` (``since <= lower <= upper <= shard upper``): the updates with
  ``lower <= _time < upper``, times below ``since`` read as ``since`` (only possible when
  ``lower == since``: the feed starts with the history compacted into ``since``; compaction
  may store such times either way), summed per ``(row, _time)``, zero sums dropped.

**Parts** (:func:`plan`): those of a batch with ``lower < upper`` whose times may fall in the
read: ``min_time < upper`` and, for changes not starting at ``since``, ``max_time >= lower``
(a feed from ``since`` takes every part below ``upper``: its times may read as ``since``). An
empty change range plans no part. Each :class:`PartRead` says whether the part holds times the
engine must filter out (``below`` / ``above`` the read's bounds) or advance to ``since``.

**Schema** (:func:`reader_schema`): ``"current"`` (the shard's schema now), ``"as_of"`` (the one
current at the read's time: snapshot ``as_of``, changes ``max(lower, upper - 1)``) or a schema
id, resolved on the version the caller read first. Every part is read through the schema id
its batch was written with and projected by field id (:func:`shardsink.core.schema.projection_for`):
renamed columns from their old name, added ones as typed nulls, widened ones cast, dropped
ones not read. SUBTLE: a part may hold a column of the reader's *name* with another field id
(dropped, then added again): engines take the projection from the plan, never from the file.

**Parts as stored** (:func:`plan_parts`, a :class:`PartsPlan`): a read of whole parts with
their times as stored, none filtered or advanced to ``since``, for readers that need every
update (the reclock's remap bindings, re-processing's prior corrections): every live part of
the version, or the parts an earlier read of the state named (by key: the criterion is the
caller's, e.g. :func:`shardsink.sinks.reprocess.prior_corrections`), a part no longer live
being a CorruptionError. Projected onto the current schema or a schema id
(:func:`parts_schema`) like any read. Only the pyarrow read handle reads one
(:meth:`shardsink.core.read.ReadHandle.read_batch_parts`); no engine is handed one.

**Leases** (:func:`pin`, :func:`pin_parts`): a leased read takes its lease at ``as_of``
(changes: at ``lower``; parts as stored, which filter no time: at ``since``) and its parts from
the version read *after* the lease was written (:func:`shardsink.core.leases.acquire_pinned`):
GC keeps every part of that version while the lease lives. The pyarrow snapshots and change
feeds of core read one head version and hold no lease; its reads of parts as stored do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import pyarrow as pa

from shardsink.core import checks as ck
from shardsink.core import schema as sch
from shardsink.core.leases import LeaseHost, LeaseKeeper
from shardsink.core.schema import ColumnProjection
from shardsink.core.state import BatchMeta, Header, PartMeta, SchemaEntry, Version
from shardsink.errors import CorruptionError, InvalidUsageError, ReadFrontierError

#: Which schema a read projects onto: the shard's current one, or the one current at the read's time.
SchemaChoice = Literal["current", "as_of"]
SCHEMA_CHOICES: tuple[SchemaChoice, ...] = ("current", "as_of")
Mode = Literal["snapshot", "changes"]


def check_schema_choice(schema: object) -> SchemaChoice:
    """``schema`` if it is a schema choice (``"current"`` or ``"as_of"``), else InvalidUsageError naming it."""
    if not isinstance(schema, str) or schema not in SCHEMA_CHOICES:
        raise InvalidUsageError(f"schema {schema!r:.120} is not a schema choice; expected 'current' or 'as_of'",
                                value=str(schema)[:120])
    return "current" if schema == "current" else "as_of"


@dataclass(frozen=True)
class Bounds:
    """A read's times: a snapshot (``lower`` None, ``upper = as_of + 1``) or the change feed
    ``[lower, upper)``."""

    mode: Mode
    lower: int | None
    upper: int

    @classmethod
    def resolve(cls, url: str, h: Header, *, as_of: int | None = None,
                changes: tuple[int, int] | None = None) -> Bounds:
        """The snapshot at ``as_of`` (default ``upper - 1``) or, with ``changes``, the feed
        ``changes = (lower, upper)``, checked against ``h``'s frontiers (ReadFrontierError /
        InvalidUsageError naming the value: a closed shard without ``as_of``, both given, bad pairs)."""
        if changes is None:
            if as_of is None:
                if h.upper is None:
                    raise ReadFrontierError(f"shard {url} is closed; pass an explicit as_of")
                as_of = h.upper - 1
            t = ck.check_as_of(url, h, as_of)
            return cls("snapshot", None, t + 1)
        if as_of is not None:
            raise InvalidUsageError("pass either as_of (a snapshot) or changes=(lower, upper), not both")
        if not isinstance(changes, tuple) or len(changes) != 2:
            raise InvalidUsageError(f"changes={changes!r:.120} must be a (lower, upper) pair of times")
        ck.check_changes(url, h, *changes)
        return cls("changes", changes[0], changes[1])

    @property
    def as_of(self) -> int:
        """The snapshot's ``as_of`` (``upper - 1``)."""
        return self.upper - 1

    @property
    def lease_at(self) -> int:
        """Where a lease protects this read: ``as_of``, or a feed's ``lower``."""
        return self.as_of if self.lower is None else self.lower

    @property
    def time(self) -> int:
        """The data time the ``"as_of"`` schema choice is taken at (changes: ``max(lower, upper - 1)``)."""
        return self.as_of if self.lower is None else max(self.lower, self.upper - 1)

    def check(self, url: str, h: Header) -> None:
        """ReadFrontierError unless these bounds are readable on ``h``."""
        if self.lower is None:
            ck.check_as_of(url, h, self.as_of)
        else:
            ck.check_changes(url, h, self.lower, self.upper)


def reader_schema(h: Header, choice: SchemaChoice | int, bounds: Bounds, *, url: str = "the shard") -> SchemaEntry:
    """The schema ``bounds`` project onto: ``"current"``, ``"as_of"`` (the one current at
    :attr:`Bounds.time`) or a schema id ``h`` knows (InvalidUsageError naming a bad one)."""
    if isinstance(choice, int) and not isinstance(choice, bool):
        return sch.known(h, choice, url=url)
    if check_schema_choice(choice) == "current":
        return sch.current(h)
    return sch.as_of(h, bounds.time)


@dataclass(frozen=True, kw_only=True)
class PartRead:
    """One part to scan: ``source``, the schema its batch was written with (``written``: its
    user columns as Arrow); ``projection``, one entry per reader column in order (the part's
    column to read, None for typed nulls; the type to cast to). Times: ``below`` / ``above``,
    whether it holds times under the read's lower bound / at or past its upper (the engine
    filters them out); ``advance``, whether it holds times below ``since`` that read as
    ``since`` (advanced before any filter). ``drops``: the projection leaves out a column the
    part holds (by field id), so rows it keeps apart may read equal."""

    part: PartMeta
    source: SchemaEntry
    written: pa.Schema
    projection: tuple[ColumnProjection, ...]
    below: bool = False
    above: bool = False
    advance: bool = False
    drops: bool = False

    @property
    def schema_id(self) -> int:
        return self.source.id

    @property
    def cut(self) -> bool:
        """Whether some of its times lie outside the read (it needs the time filter)."""
        return self.below or self.above


@dataclass(frozen=True, kw_only=True)
class ReadPlan:
    """What a read of ``url`` loads from the state version ``seqno``: ``parts`` projected onto
    ``target`` (``schema``: its user columns, without ``_time``/``_diff``/``_count``), the
    updates with ``lower <= _time < upper`` (snapshot: ``lower`` None, ``upper = as_of + 1``),
    times below ``since`` read as ``since`` where ``advance``. Picklable (the Spark data source
    ships it to executors)."""

    url: str
    mode: Mode
    seqno: int
    target: SchemaEntry
    schema: pa.Schema
    parts: tuple[PartRead, ...]
    lower: int | None
    upper: int
    since: int
    advance: bool
    filter_lower: bool = field(init=False)
    filter_upper: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "filter_lower", any(r.below for r in self.parts))
        object.__setattr__(self, "filter_upper", any(r.above for r in self.parts))

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.mode, self.lower, self.upper)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    @property
    def as_of(self) -> int:
        """The snapshot's ``as_of`` (``upper - 1``)."""
        return self.upper - 1

    @property
    def empty(self) -> bool:
        """Nothing can be in the result (no parts, or an empty change range)."""
        return not self.parts or (self.lower is not None and self.lower >= self.upper)

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

    def schemas(self) -> list[pa.Schema]:
        """The reader's user schema and those its parts were written with (each once)."""
        out = {self.target.id: self.schema}
        for r in self.parts:
            out.setdefault(r.schema_id, r.written)
        return list(out.values())

    def describe(self) -> str:
        what = f"as of {self.as_of}" if self.mode == "snapshot" else f"changes [{self.lower}, {self.upper})"
        return f"shard {self.url} {what} (state {self.seqno})"


def plan(url: str, version: Version, batches: Sequence[BatchMeta], bounds: Bounds, target: SchemaEntry) -> ReadPlan:
    """THE part selection (module docstring) of ``bounds`` on ``version`` (whose live batches
    are ``batches``), projected onto ``target``. ReadFrontierError if ``bounds`` are not
    readable on ``version``; CorruptionError if a batch names a schema the state does not hold."""
    h = version.header
    bounds.check(url, h)
    lo, hi = bounds.lower, bounds.upper
    floor = None if lo is None or lo <= h.since else lo  # a feed from since: its times may read as since
    if lo is not None and lo >= hi:
        wanted: list[tuple[BatchMeta, PartMeta]] = []
    else:
        wanted = [(b, p) for b in batches if b.lower < hi for p in b.parts
                  if p.min_time < hi and (floor is None or p.max_time >= floor)]
    advance = lo is not None and floor is None and any(p.min_time < h.since for _, p in wanted)
    # Advanced times are >= since == lower: only a part below lower without advancing needs that bound.
    reads = part_reads(url, h, wanted, target, lower=None if advance else lo, upper=hi,
                       since=h.since if advance else None)
    return ReadPlan(url=url, mode=bounds.mode, seqno=version.seqno, target=target, schema=sch.entry_schema(target),
                    parts=tuple(reads), lower=lo, upper=hi, since=h.since, advance=advance)


def part_reads(url: str, h: Header, wanted: Sequence[tuple[BatchMeta, PartMeta]], target: SchemaEntry, *,
               lower: int | None = None, upper: int | None = None, since: int | None = None) -> list[PartRead]:
    """``wanted`` parts (each with its batch) as read onto ``target``: projected by field id
    from their batch's schema id; ``lower``/``upper``: the time bounds to mark parts against
    (None: none); ``since``: advance times below it. CorruptionError if a batch names a schema
    id the state ``h`` does not hold."""
    entries = {e.id: e for e in sch.history(h)}
    wanted_ids = {f.id for f in target.fields}
    shapes: dict[int, tuple[pa.Schema, tuple[ColumnProjection, ...], bool]] = {}
    out = []
    for b, p in wanted:
        src = entries.get(b.schema_id)
        if src is None:
            raise CorruptionError(f"batch {b.desc_id} of {url} names schema id {b.schema_id}, which the state "
                                  f"does not hold (it holds {sorted(entries)})")
        if src.id not in shapes:
            drops = src.id != target.id and not {f.id for f in src.fields} <= wanted_ids
            shapes[src.id] = (sch.entry_schema(src), sch.projection_for(src, target), drops)
        written, proj, drops = shapes[src.id]
        out.append(PartRead(part=p, source=src, written=written, projection=proj, drops=drops,
                            below=lower is not None and p.min_time < lower,
                            above=upper is not None and p.max_time >= upper,
                            advance=since is not None and p.min_time < since))
    return out


class _Batches(Protocol):
    def batches(self, version: Version | None = None) -> tuple[BatchMeta, ...]: ...


class Readable(LeaseHost, Protocol):
    """What :func:`pin` and :func:`plan_pinned` need of a shard (:class:`shardsink.core.shard.Shard`)."""

    def reader(self) -> _Batches: ...


@dataclass(frozen=True)
class Pinned:
    """A leased read: its ``bounds`` and reader schema ``target`` (both resolved on the version
    the caller read first) and ``version``, the one read after its lease was written, which
    its parts come from."""

    url: str
    bounds: Bounds
    target: SchemaEntry
    version: Version


def pin(shard: Readable, keeper: LeaseKeeper, head: Version, *, holder: str, as_of: int | None = None,
        changes: tuple[int, int] | None = None, schema: SchemaChoice | int = "current") -> Pinned:
    """Resolve and check the read on ``head`` (a version the caller read; :meth:`Bounds.resolve`,
    :func:`reader_schema`), then hold ``keeper``'s lease at :attr:`Bounds.lease_at` and pin
    the version read after it (module docstring). Raises before any lease is written on a bad call."""
    bounds = Bounds.resolve(shard.url, head.header, as_of=as_of, changes=changes)
    target = reader_schema(head.header, schema, bounds, url=shard.url)
    pinned = keeper.acquire_pinned(shard, bounds.lease_at, holder=holder, head=head)[1]
    return Pinned(shard.url, bounds, target, pinned)


def plan_pinned(shard: Readable, pinned: Pinned) -> ReadPlan:
    """:func:`plan` of a leased read, on the version its lease pinned."""
    return plan(pinned.url, pinned.version, shard.reader().batches(pinned.version), pinned.bounds, pinned.target)


@dataclass(frozen=True, kw_only=True)
class PartsPlan:
    """What a read of parts as stored (module docstring) loads from the state version ``seqno``:
    ``parts`` projected onto ``target`` (``schema``: its user columns, without ``_time``/``_diff``),
    every time as stored."""

    url: str
    seqno: int
    target: SchemaEntry
    schema: pa.Schema
    parts: tuple[PartRead, ...]


def parts_schema(h: Header, choice: Literal["current"] | int, *, url: str = "the shard") -> SchemaEntry:
    """The schema a read of parts as stored projects onto: ``"current"`` or a schema id ``h``
    knows (InvalidUsageError naming a bad one). No ``"as_of"``: such a read has no time."""
    if isinstance(choice, int) and not isinstance(choice, bool):
        return sch.known(h, choice, url=url)
    if choice != "current":
        raise InvalidUsageError(f"schema {choice!r:.120} of a read of parts as stored must be 'current' or a "
                                "schema id", value=str(choice)[:120])
    return sch.current(h)


def plan_parts(url: str, version: Version, batches: Sequence[BatchMeta], target: SchemaEntry, *,
               keys: Sequence[str] | None = None) -> PartsPlan:
    """THE part selection of a read of parts as stored (module docstring) on ``version`` (whose
    live batches are ``batches``), projected onto ``target``: every live part (``keys`` None) or
    the parts of ``keys``, in that order (CorruptionError naming the first one ``version`` no
    longer holds). CorruptionError if a batch names a schema the state does not hold."""
    if keys is None:
        wanted = [(b, p) for b in batches for p in b.parts]
    else:
        live = {p.key: (b, p) for b in batches for p in b.parts}
        gone = [k for k in keys if k not in live]
        if gone:
            raise CorruptionError(f"part {gone[0]} of {url} left the state while being read (state version "
                                  f"{version.seqno} no longer holds it: compacted meanwhile?)")
        wanted = [live[k] for k in keys]
    return PartsPlan(url=url, seqno=version.seqno, target=target, schema=sch.entry_schema(target),
                     parts=tuple(part_reads(url, version.header, wanted, target)))


def pin_parts(shard: LeaseHost, keeper: LeaseKeeper, head: Version, *, holder: str) -> Version:
    """Hold ``keeper``'s lease for a read of parts as stored, at the ``since`` of ``head`` (a
    version the caller read), and return the version read after it, which its parts come from
    (:func:`plan_parts`). Such a read holds no time, so a ``since`` advanced meanwhile (the
    lease's re-check refuses it) is no refusal: the lease is taken again at the new one."""
    for attempt in range(_PIN_ATTEMPTS):
        try:
            return keeper.acquire_pinned(shard, head.header.since, holder=holder, head=head)[1]
        except ReadFrontierError:
            if attempt == _PIN_ATTEMPTS - 1:
                raise
            head = shard._machine.head().version
    raise AssertionError("unreachable")


#: How often :func:`pin_parts` takes its lease again after ``since`` moved past it.
_PIN_ATTEMPTS = 5
