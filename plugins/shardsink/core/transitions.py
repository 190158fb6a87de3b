"""The pure transitions between shard states: the commit rule and the maintenance rules. No I/O.

:func:`apply` is the one entry point: (header, live batches, command, stamp) → the next
version, or a typed refusal (:data:`Refusal`), dispatching on the command's type to the
rule registered for it with :func:`rule` (:mod:`shardsink.core.commands`; every kind has one,
:func:`rule_of`; a create's refuses where a shard exists, version 0 is :func:`initial_version`).
:func:`compare_and_append` is the commit rule of DESIGN.md. The maintenance rules sit beside
it, equally pure: :func:`apply_compaction` (replace live input batches by their merge; refused
unless every input is still live), :func:`advance_since`, :func:`set_retention`,
:func:`evolve_schema` (one change) and :func:`evolve_to_target` (a target schema: Unchanged
when already held, SchemaConflict when it cannot be reached). Each rule builds its kind's
commit record (:mod:`shardsink.core.commits`) from the command and the stamp. All of them are
committed by the same conditional put (``Machine.commit``), so maintenance never blocks
appends: a lost race re-applies the command on the fresh head. :func:`apply_diffs` rebuilds
the live batch list from a rollup and the diffs after it. The values they work on are in
:mod:`shardsink.core.state`.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import zip_longest
from typing import Any, TypeVar

import pyarrow as pa

from shardsink.core import commits as cm
from shardsink.core import schema as sc
from shardsink.core.commands import (
    AppendCommand,
    Command,
    CompactCommand,
    CreateCommand,
    EvolveToCommand,
    OptionCommand,
    RetentionCommand,
    SchemaCommand,
    SinceCommand,
    Stamp,
)
from shardsink.core.refusals import (  # re-exported: callers name tr.Unchanged, tr.Refusal, ...
    AlreadyCommitted as AlreadyCommitted,
)
from shardsink.core.refusals import AlreadyExists as AlreadyExists
from shardsink.core.refusals import InputsGone as InputsGone
from shardsink.core.refusals import Refusal as Refusal
from shardsink.core.refusals import SchemaConflict as SchemaConflict
from shardsink.core.refusals import Unchanged as Unchanged
from shardsink.core.refusals import UpperMismatch as UpperMismatch
from shardsink.core.state import BatchMeta, Header, MergedDesc, Stats, Version, WriterRecord
from shardsink.errors import InvalidUsageError

#: How many recent description ids each header remembers for idempotency.
RECENT_DESCS = 128
#: How many writers' last commits each header remembers.
WRITERS = 64
#: How many merged descriptions a compacted batch remembers (the newest; ~40-100 bytes each in JSON).
LINEAGE_MAX = 1024
#: The ids compaction gives its output batches (shardsink.maintenance.compact).
COMPACTION_ID = re.compile(r"compact-[0-9a-f]{32}")


#: A command kind's rule on an existing shard: (header, live batches, command, stamp) → the next
#: version or a refusal.
Rule = Callable[[Header, Sequence[BatchMeta], Any, Stamp], Version | Refusal]
_RULES: dict[type[Any], Rule] = {}
C = TypeVar("C")


def rule(kind: type[C]) -> Callable[[Callable[[Header, Sequence[BatchMeta], C, Stamp], Version | Refusal]],
                                      Callable[[Header, Sequence[BatchMeta], C, Stamp], Version | Refusal]]:
    """Register the pure rule applying commands of ``kind`` (one per kind)."""
    def register(fn: Callable[[Header, Sequence[BatchMeta], C, Stamp], Version | Refusal]
                 ) -> Callable[[Header, Sequence[BatchMeta], C, Stamp], Version | Refusal]:
        assert kind not in _RULES, kind
        _RULES[kind] = fn
        return fn
    return register


def rule_of(kind: type[Any]) -> Rule:
    """The rule registered for commands of ``kind``; NotImplementedError naming ``kind`` when none
    is (a command added to :data:`shardsink.core.commands.Command` without its ``@rule``)."""
    if kind not in _RULES:
        raise NotImplementedError(f"no transition rule is registered for command kind {kind.__module__}."
                                  f"{kind.__qualname__}: register one with @rule({kind.__name__}) in {__name__}")
    return _RULES[kind]


def apply(header: Header | None, batches: Sequence[BatchMeta], cmd: Command, stamp: Stamp) -> Version | Refusal:
    """The next version after ``header`` under ``cmd`` stamped ``stamp``, or why not; pure and
    deterministic. ``header``: the newest version's (None: no version exists, only a create
    applies); ``batches``: the live batches at it, read only by a command whose
    ``needs_batches``. NotImplementedError naming a command kind no rule is registered for."""
    applies = rule_of(type(cmd))
    if header is not None:
        return applies(header, batches, cmd, stamp)
    if isinstance(cmd, CreateCommand):
        return initial_version(schema=cmd.schema, upper=cmd.upper, stamp=stamp)
    raise InvalidUsageError(f"{type(cmd).__name__} needs an existing shard")


def initial_version(*, schema: pa.Schema, upper: int, stamp: Stamp) -> Version:
    """Version 0 of a new shard: what a create makes where no version exists."""
    header = Header(0, upper, 0, schema, 0, (), (), Stats(), removal=-1, prior_removal=-1)
    return Version(header, (), (), cm.CreateCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, upper=upper))


@rule(CreateCommand)
def refuse_create(_h: Header, _b: Sequence[BatchMeta], _c: CreateCommand, _s: Stamp) -> Refusal:
    """The create rule where a version exists: AlreadyExists, always (version 0 is
    :func:`initial_version`, which :func:`apply` makes where there is no header)."""
    return AlreadyExists()


def with_removal(header: Header) -> Header:
    """``header`` (already at its new seqno) marked as a version that removes batches.

    Every transition whose diff removes batches must mark its header this way: GC trusts
    the chain (:attr:`Header.removal`) to name every such version. An unknown chain
    (None, from an older writer) stays unknown up to here, which GC handles by reading
    the history the slow way."""
    return replace(header, removal=header.seqno, prior_removal=header.removal)


@rule(AppendCommand)
def compare_and_append(header: Header, _: Sequence[BatchMeta], cmd: AppendCommand, stamp: Stamp) -> Version | Refusal:
    """The commit rule. Bounds were validated by the caller (``lower < upper``)."""
    done = header.committed_seqno(cmd.desc_id)
    if done is not None:
        return AlreadyCommitted(done)
    if header.upper != cmd.lower:
        return UpperMismatch(header.upper)
    sid = sc.current(header).id if cmd.schema_id is None else sc.known(header, cmd.schema_id).id
    seqno = header.seqno + 1
    rows = sum(p.rows for p in cmd.parts)
    added = (BatchMeta(cmd.desc_id, cmd.lower, cmd.upper, seqno, cmd.parts, schema_id=sid),) if cmd.parts else ()
    writers = tuple(w for w in header.writers if w.writer != stamp.writer)
    writers = (*writers, WriterRecord(stamp.writer, cmd.desc_id, seqno, stamp.at))[-WRITERS:]
    s = header.stats
    stats = Stats(
        s.batches + len(added),
        s.parts + len(cmd.parts),
        s.rows + rows,
        s.bytes + sum(p.bytes for p in cmd.parts),
    )
    new = replace(
        header,
        seqno=seqno,
        upper=cmd.upper,
        recent=(*header.recent, (cmd.desc_id, seqno))[-RECENT_DESCS:],
        writers=writers,
        stats=stats,
    )
    by = {"at": stamp.at, "writer": stamp.writer, "nonce": stamp.nonce}
    info = (cm.CloseCommit(**by, desc_id=cmd.desc_id, lower=cmd.lower, rows=rows, props=cmd.props)
            if cmd.upper is None else
            cm.AppendCommit(**by, desc_id=cmd.desc_id, lower=cmd.lower, upper=cmd.upper, rows=rows, props=cmd.props,
                         listing=cmd.listing))
    return Version(new, added, (), info)


def _bumped(header: Header, seqno: int, entry: str, writer: str, at: str) -> Header:
    """``header`` at ``seqno`` with ``entry`` recorded in ``recent`` and ``writer``'s record."""
    writers = tuple(w for w in header.writers if w.writer != writer)
    writers = (*writers, WriterRecord(writer, entry, seqno, at))[-WRITERS:]
    return replace(header, seqno=seqno, recent=(*header.recent, (entry, seqno))[-RECENT_DESCS:], writers=writers)


@rule(CompactCommand)
def apply_compaction(header: Header, batches: Sequence[BatchMeta], cmd: CompactCommand,
                     stamp: Stamp) -> Version | Refusal:
    """The compaction rule: ``batches`` are the live batches at ``header``.

    Applies only if every input is still live, adjacent and in order (then they are
    replaced, in place, by one batch named ``compaction_id``, or by nothing if the merge
    consolidated to no updates). The upper never changes. Refusals: AlreadyCommitted
    (``compaction_id`` in the idempotency window), InputsGone (an input was replaced by
    another compaction: this one can never apply).
    """
    done = header.committed_seqno(cmd.compaction_id)
    if done is not None:
        return AlreadyCommitted(done)
    ids = [b.desc_id for b in batches]
    missing = tuple(i for i in cmd.inputs if i not in ids)
    if missing:
        return InputsGone(missing)
    first = ids.index(cmd.inputs[0])
    if tuple(ids[first:first + len(cmd.inputs)]) != cmd.inputs:
        # Live but no longer adjacent cannot happen (batches only ever leave the list, and
        # a merge takes an adjacent run's place): treat a foreign layout as a lost race.
        return InputsGone(())
    if cmd.since > header.since:
        raise InvalidUsageError(
            f"compaction {cmd.compaction_id} was consolidated at since {cmd.since}, above the shard's {header.since}"
        )
    gone = batches[first:first + len(cmd.inputs)]
    sid = sc.current(header).id if cmd.schema_id is None else sc.known(header, cmd.schema_id).id
    seqno = header.seqno + 1
    added = (BatchMeta(cmd.compaction_id, cmd.lower, cmd.upper, seqno, cmd.parts, merged_lineage(gone),
                       schema_id=sid),) if cmd.parts else ()
    s = header.stats
    stats = Stats(
        s.batches - len(gone) + len(added),
        s.parts - sum(len(b.parts) for b in gone) + len(cmd.parts),
        s.rows - sum(b.rows for b in gone) + sum(p.rows for p in cmd.parts),
        s.bytes - sum(b.bytes for b in gone) + sum(p.bytes for p in cmd.parts),
    )
    new = with_removal(replace(_bumped(header, seqno, cmd.compaction_id, stamp.writer, stamp.at), stats=stats))
    rows = sum(p.rows for p in cmd.parts)
    info = cm.CompactCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, compaction_id=cmd.compaction_id,
                         lower=cmd.lower, upper=cmd.upper, rows=rows)
    return Version(new, added, cmd.inputs, info, tuple(b.lower for b in gone))


def merged_lineage(batches: Sequence[BatchMeta]) -> tuple[MergedDesc, ...]:
    """The lineage of one batch merging ``batches`` (in time order): every appended batch
    is one record, a compacted one brings its own records; the newest LINEAGE_MAX are kept.

    A batch of unknown origin (a compaction output written before lineage existed) adds
    nothing: what it merged is not known, and a record of it could claim the wrong thing.
    """
    return tuple(m for b in batches for m in lineage_of(b))[-LINEAGE_MAX:]


def lineage_of(b: BatchMeta) -> tuple[MergedDesc, ...]:
    """The descriptions whose commits ``b`` holds: itself if appended, its lineage if compacted,
    nothing if it is a compaction output of unknown lineage (written before lineage existed)."""
    if b.lineage is not None:
        return b.lineage
    if COMPACTION_ID.fullmatch(b.desc_id):
        return ()
    return (MergedDesc(b.desc_id, b.lower, b.upper, b.seqno, b.rows),)


def since_target(header: Header, cmd: SinceCommand) -> int:
    """Where :func:`advance_since` would put ``since`` (may be <= the current since)."""
    caps = [c for c in (cmd.lease_cap, cmd.target) if c is not None]
    if header.upper is not None:
        if header.retention is not None:
            caps.append(header.upper - max(1, header.retention))
        elif cmd.target is None:
            return header.since
        caps.append(header.upper - 1)
    elif header.retention is None and cmd.target is None:
        return header.since
    return min(caps) if caps else header.since


@rule(SinceCommand)
def advance_since(header: Header, _: Sequence[BatchMeta], cmd: SinceCommand, stamp: Stamp) -> Version | Refusal:
    """The since rule (DESIGN.md "Retention and grace"): never backwards, never past a lease."""
    new_since = since_target(header, cmd)
    if new_since <= header.since:
        return Unchanged(f"since stays at {header.since} (target {new_since})")
    seqno = header.seqno + 1
    new = replace(header, seqno=seqno, since=new_since)
    info = cm.SinceCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, old=header.since, new=new_since)
    return Version(new, (), (), info)


@rule(RetentionCommand)
def set_retention(header: Header, _: Sequence[BatchMeta], cmd: RetentionCommand, stamp: Stamp) -> Version | Refusal:
    """Record the shard's retention (ms, or None for all history); Unchanged if it is already so."""
    if cmd.retention is not None and cmd.retention < 1:
        raise InvalidUsageError(f"retention {cmd.retention} ms must be at least 1")
    if header.retention == cmd.retention:
        return Unchanged(f"retention is already {cmd.retention}")
    seqno = header.seqno + 1
    new = replace(header, seqno=seqno, retention=cmd.retention)
    info = cm.RetentionCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, old=header.retention,
                           new=cmd.retention)
    return Version(new, (), (), info)


#: A shard option's name and the longest value it may hold.
_OPTION_NAME, _OPTION_VALUE_MAX = re.compile(r"[a-z][a-z0-9_.-]{0,63}"), 256


@rule(OptionCommand)
def set_option(header: Header, _: Sequence[BatchMeta], cmd: OptionCommand, stamp: Stamp) -> Version | Refusal:
    """Record shard option ``cmd.name`` (InvalidUsageError for a malformed name or value, nothing written);
    Unchanged if it already has that value."""
    if not isinstance(cmd.name, str) or not _OPTION_NAME.fullmatch(cmd.name):
        raise InvalidUsageError(f"option name {cmd.name!r:.80} must match {_OPTION_NAME.pattern}", value=str(cmd.name))
    if cmd.value is not None and (not isinstance(cmd.value, str) or len(cmd.value) > _OPTION_VALUE_MAX):
        raise InvalidUsageError(f"option {cmd.name} value {cmd.value!r:.80} must be a string of at most "
                                f"{_OPTION_VALUE_MAX} characters", value=str(cmd.value)[:120])
    old = header.option(cmd.name)
    if old == cmd.value:
        return Unchanged(f"option {cmd.name} is already {cmd.value!r}")
    opts = {**dict(header.options), cmd.name: cmd.value}
    new = replace(header, seqno=header.seqno + 1,
                  options=tuple(sorted((k, v) for k, v in opts.items() if v is not None)))
    info = cm.OptionCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, name=cmd.name, old=old, new=cmd.value)
    return Version(new, (), (), info)


@rule(SchemaCommand)
def evolve_schema(header: Header, _: Sequence[BatchMeta], cmd: SchemaCommand, stamp: Stamp) -> Version:
    """The schema rule: validate ``cmd.change`` against the current schema (InvalidUsageError
    if refused) and make the result current, as the next schema id. Batches are untouched:
    their parts keep being read through their own schema id."""
    schema, ids = sc.evolve(header, cmd.change)
    return _schema_version(header, schema, ids, cmd.change.describe(), stamp)


@rule(EvolveToCommand)
def evolve_to_target(header: Header, _: Sequence[BatchMeta], cmd: EvolveToCommand,
                     stamp: Stamp) -> Version | Refusal:
    """The evolve-to-target rule: the adds and widenings that make the current schema hold
    ``cmd.target`` (:func:`shardsink.core.schema.changes_to`), as one new schema id. Unchanged
    (with the id that holds the target) when there is nothing to do; SchemaConflict when a column
    cannot get there, or (``exact``) when the result, or with nothing to do every schema id,
    differs from the target. A planned change :func:`shardsink.core.schema.evolve_all` refuses
    (a type no change can name) is InvalidUsageError, nothing written."""
    cur = sc.current(header)
    plan = sc.changes_to(schema := sc.entry_schema(cur), cmd.target)
    if isinstance(plan, sc.Clash):
        return SchemaConflict(cur.id, plan.name, plan.describe())
    if not plan:
        held = sc.id_of(header, cmd.target) if cmd.exact else cur.id
        if held is None:
            return _inexact(cur.id, schema, cmd.target)
        return Unchanged(f"schema {held} already holds the target", schema_id=held)
    new, ids = sc.evolve_all(header, plan)
    if cmd.exact and not new.equals(cmd.target):
        return _inexact(cur.id, new, cmd.target)
    return _schema_version(header, new, ids, ", ".join(c.describe() for c in plan), stamp)


def _inexact(schema_id: int, got: pa.Schema, target: pa.Schema) -> SchemaConflict:
    """The refusal of an exact target that ``got`` (what schema ``schema_id`` holds or evolves to) is not."""
    column = next((a if a is not None else b).name for a, b in zip_longest(got, target)
                  if a is None or b is None or not a.equals(b))
    return SchemaConflict(schema_id, column, f"schema {schema_id} would become ({sc.fields_text(got)}), not the "
                                             f"({sc.fields_text(target)}) asked for; column {column!r} differs")


def _schema_version(header: Header, schema: pa.Schema, ids: tuple[int, ...], change: str, stamp: Stamp) -> Version:
    """The version making ``schema`` (field ids ``ids``) current as the next schema id."""
    hist = sc.history(header)
    seqno = header.seqno + 1
    new_id = hist[-1].id + 1
    entry = sc.make_entry(schema, ids, id=new_id, seqno=seqno, at=stamp.at, upper=header.upper)
    # Not recorded in ``recent`` (description ids live there: a user's could be spelled alike);
    # an unknown outcome is resolved by the nonce, as a since advance's is.
    new = replace(header, seqno=seqno, schema=schema, schemas=(*hist, entry))
    info = cm.SchemaCommit(at=stamp.at, writer=stamp.writer, nonce=stamp.nonce, old_id=hist[-1].id, new_id=new_id,
                        change=change)
    return Version(new, (), (), info)


def apply_diffs(batches: Sequence[BatchMeta], versions: Iterable[Version]) -> tuple[BatchMeta, ...]:
    """The live batch list after applying ``versions`` (consecutive seqnos) in order.

    Appends go to the end; what a commit that removes batches adds (a compaction's output)
    takes the place of its first removed batch, so the list stays in time order.
    """
    out = list(batches)
    for v in versions:
        if v.removed and v.commit.removes_batches:
            gone = set(v.removed)
            at = next((i for i, b in enumerate(out) if b.desc_id in gone), len(out))
            out = [b for b in out[:at] if b.desc_id not in gone] + list(v.added) + [
                b for b in out[at:] if b.desc_id not in gone
            ]
            continue
        if v.removed:
            gone = set(v.removed)
            out = [b for b in out if b.desc_id not in gone]
        out.extend(v.added)
    return tuple(out)


def with_rollup(version: Version, rollup: int) -> Version:
    """``version`` pointing at a newer rollup (used for the LATEST hint)."""
    if rollup <= version.header.rollup:
        return version
    return replace(version, header=replace(version.header, rollup=rollup))
