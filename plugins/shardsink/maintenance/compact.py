"""Compaction: merge runs of adjacent live batches into one consolidated batch each.

One compaction of inputs ``B1..Bk`` (adjacent, live)::

    1. write staging/<cid>/compaction.json   (its inputs: lets a later sweep decide its fate)
    2. merge their parts (streaming, bounded memory) into parts/<cid>/…, times < since → since
    3. commit a CompactCommand (transitions.apply_compaction) by the one conditional put (AdminHandle.commit);
       a lost race re-applies it on the fresh head, re-checking that every input is live
    4. applied ⇒ delete the manifest; refused (an input is gone) ⇒ delete its output;
       both through AdminHandle.delete_staged (core.fate's one deleter), which re-derives the fate first

The output schema is the newest one, except where that would delete a dropped column some
readable time still shows (:func:`shardsink.maintenance.schedule.merge_target`): the schedule keeps
such batches out, and :func:`compact_batches` refuses them (nothing written) when mixed with
others. SUBTLE: the header is read once, before the merge; a drop committed meanwhile only
makes the output's schema (then no longer the newest) hold the column: nothing is lost, and
``since`` only grows, so a stale since keeps out more, never less.

A merge that fails before step 3 (CorruptionError from a ``_diff`` sum outside int64, an
unreadable input, a storage error, …) deletes its manifest and whatever output it wrote
(:func:`_abandon`): its inputs stay live, so no fate read could ever call it dead and the
sweep would keep its leftovers for as long as those inputs live (for a deterministic
failure, forever, and one more set per retry).

Everything goes through the maintenance handle (:mod:`shardsink.core.admin`): the manifest,
the output parts (its batch builder), the commit and the deletes (but :func:`_abandon`'s, which
hands the one deleter a decided fate through the write handle).

It never blocks appends: appends racing it commit, and it re-applies on top of them
(the upper is not touched). The inputs' parts stay referenced by older state versions;
deleting them is GC's job.

Crash safety: a crash before 3 leaves unreferenced output that can never be read (no
version references it); :func:`sweep` deletes it once its fate is CannotCommit (a later
compaction replaced an input) and the manifest is older than the grace period. A crash
after 3 leaves only the manifest (the sweep finds the compaction Committed and keeps its
parts). An unknown outcome at 3 deletes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from shardsink.core import fate as ft
from shardsink.core import manifests as mf
from shardsink.core import schema as sch
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.admin import AdminHandle
from shardsink.core.commands import CompactCommand
from shardsink.core.shard import Shard
from shardsink.errors import CorruptionError, InvalidUsageError, ShardsinkError, UnknownOutcomeError
from shardsink.maintenance.merge import MergeOptions, MergeStats, OnBatch, merge_parts
from shardsink.maintenance.projected import projected_inputs
from shardsink.maintenance.schedule import ScheduleOptions, merge_target, schedule_merges

log = logging.getLogger(__name__)

#: Default age below which :func:`sweep` leaves a compaction's leftovers alone.
GRACE_S = 3600.0


@dataclass(frozen=True)
class Hooks:
    """Test hooks (injected by tests, never read from the environment): called at the
    steps of one compaction; raising from one simulates a crash there."""

    after_manifest: Callable[[str], None] | None = None
    after_outputs: Callable[[str], None] | None = None
    after_commit: Callable[[str], None] | None = None
    on_batch: OnBatch | None = None

    def call(self, name: Literal["after_manifest", "after_outputs", "after_commit"], cid: str) -> None:
        fn = getattr(self, name)
        if fn is not None:
            fn(cid)


@dataclass(frozen=True)
class CompactOptions:
    schedule: ScheduleOptions = field(default_factory=ScheduleOptions)
    merge: MergeOptions = field(default_factory=MergeOptions)
    writer: str | None = None
    hooks: Hooks = field(default_factory=Hooks)


@dataclass(frozen=True)
class Merge:
    """One compaction's outcome."""

    compaction_id: str
    inputs: tuple[str, ...]
    status: Literal["applied", "refused", "unknown"]
    seqno: int | None
    rows_in: int
    rows_out: int
    parts_in: int
    parts_out: int
    deleted: int
    streamed: bool


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact` did. ``batches_before`` counts live batches when it started,
    ``batches_after`` the same minus what its applied merges removed (appends racing it
    are not counted)."""

    batches_before: int
    batches_after: int
    merges: tuple[Merge, ...] = field(default=())

    @property
    def applied(self) -> int:
        return sum(1 for m in self.merges if m.status == "applied")

    def render(self) -> str:
        """For operators: ``3 batches → 1, 12 parts → 2, 1,300 rows → 1,234`` (applied merges' parts and rows)."""
        done = [m for m in self.merges if m.status == "applied"]
        text = f"{self.batches_before} batch{'' if self.batches_before == 1 else 'es'} → {self.batches_after}"
        if done:
            rows_in, rows_out = sum(m.rows_in for m in done), sum(m.rows_out for m in done)
            text += (f", {sum(m.parts_in for m in done)} parts → {sum(m.parts_out for m in done)}, "
                     + (f"{rows_in:,} rows" if rows_in == rows_out else f"{rows_in:,} rows → {rows_out:,}"))
        for status in ("refused", "unknown"):
            if n := sum(1 for m in self.merges if m.status == status):
                text += f", {n} {status}"
        return text


def _manifest(cid: str, inputs: Sequence[st.BatchMeta], since: int) -> bytes:
    return mf.encode(mf.compaction_manifest(cid, tuple(inputs), since))


def _inputs_of(data: bytes, where: str) -> tuple[str, tuple[st.BatchMeta, ...]]:
    """The compaction id and inputs (without parts) of a manifest; CorruptionError naming ``where``."""
    doc = mf.decode_compaction(data, where=where)
    return doc.compaction_id, doc.batches()


def compact(shard: Shard, *, options: CompactOptions = CompactOptions()) -> CompactionResult:
    """Merge the runs of batches the size-tiered plan picks; one commit per run.

    Reads ``since`` once: outputs are consolidated at it (``since`` only grows, so it
    stays valid whatever happens meanwhile). Raises UnknownOutcomeError only after
    finishing what it could; refusals are normal (a racing compactor won).
    """
    admin = shard.admin()
    head = admin.head()
    batches = admin.full_batches(head)
    since = head.header.since
    merges = []
    unknown: UnknownOutcomeError | None = None
    for group in schedule_merges(batches, options.schedule, header=head.header, since=since):
        try:
            merges.append(compact_batches(shard, group, since=since, header=head.header, options=options))
        except UnknownOutcomeError as e:
            unknown = e
    after = len(batches) - sum(len(x.inputs) - (1 if x.parts_out else 0) for x in merges if x.status == "applied")
    if unknown is not None:
        raise unknown
    return CompactionResult(len(batches), after, tuple(merges))


def compact_batches(shard: Shard, inputs: Sequence[st.BatchMeta], *, since: int, schema: pa.Schema | None = None,
                    header: st.Header | None = None, options: CompactOptions = CompactOptions()) -> Merge:
    """Merge ``inputs`` (adjacent live batches) into one batch and commit the replacement.

    ``since`` must not exceed the shard's since (the outputs' times are advanced to it).
    The output is written in the schema :func:`~shardsink.maintenance.schedule.merge_target` picks
    from ``header`` (the newest, inputs of older schema ids projected onto it,
    :mod:`shardsink.maintenance.projected`; or, for inputs holding a dropped column that reads
    at times >= ``since`` still show, their own one schema id); InvalidUsageError, nothing
    written, for inputs that would lose such a column. ``schema``, if given, must be that
    target (kept for callers that pass it). ``header``: a header the caller read the inputs
    from (None: read the head now). A failure of the merge deletes what it wrote and raises.
    """
    m = shard.admin()
    cid = m.new_compaction_id()
    inputs = tuple(inputs)
    if not inputs:
        raise InvalidUsageError("compact_batches needs at least one input batch")
    header = header if header is not None else m.head().header
    target = merge_target(header, inputs, since)
    if schema is not None and not schema.equals(sch.entry_schema(target)):
        raise InvalidUsageError(f"compaction schema {schema} is not the schema the merge writes "
                                f"({sch.entry_schema(target)}, schema id {target.id})")
    manifest = m.put_compaction_manifest(mf.compaction_manifest(cid, inputs, since))
    options.hooks.call("after_manifest", cid)
    try:
        source, parts = projected_inputs(m, header, inputs, target)
        stats: MergeStats = merge_parts(source, parts, sch.entry_schema(target), into=m.builder(cid), since=since,
                                        options=options.merge, on_batch=options.hooks.on_batch,
                                        field_ids=sch.parquet_field_ids(target))
    except Exception as e:
        refused = _failed_merge(shard, cid, inputs, header, e)
        if refused is None:
            raise
        return refused
    options.hooks.call("after_outputs", cid)
    upper = inputs[-1].upper
    cmd = CompactCommand(cid, tuple(b.desc_id for b in inputs), inputs[0].lower, upper, since,
                         tuple(stats.parts), target.id)
    out = m.commit(cmd, writer=options.writer)
    if isinstance(out, st.Version | tr.AlreadyCommitted):
        options.hooks.call("after_commit", cid)
    deleted = 0
    try:
        # ``only`` names exactly our objects: the output parts and the manifest (restricted
        # like the parts, see delete_staged).
        gone = m.delete_staged(cid, inputs[0].lower, inputs=inputs, only=[*(p.key for p in stats.parts), manifest])
        deleted = gone.parts
        status: Literal["applied", "refused", "unknown"] = (
            "applied" if isinstance(gone.fate, ft.Committed) else "refused"
        )
    except ft.DeleteRefusedError:  # still possible: the commit's outcome was not what it said
        status = "unknown"
    if status == "refused":
        log.info("compaction %s refused (%s); deleted its %d output parts", cid, out, deleted)
    seqno = out.seqno if isinstance(out, st.Version | tr.AlreadyCommitted) else None
    return Merge(cid, cmd.inputs, status, seqno, stats.rows_in, stats.rows_out, len(parts), len(stats.parts),
                 deleted, stats.streamed)


def _failed_merge(shard: Shard, cid: str, inputs: Sequence[st.BatchMeta], header: st.Header,
                  error: Exception) -> Merge | None:
    """After the merge of ``cid`` raised ``error``: a refusal (its leftovers deleted) if a rival
    replaced its inputs meanwhile, else None (the error stands; its leftovers deleted, :func:`_abandon`).

    SUBTLE: a missing input part is corruption only if the inputs are still live; a rival
    compaction may have replaced them and GC collected their parts meanwhile."""
    m = shard.admin()
    if isinstance(error, CorruptionError) and _replaced(m, cid, inputs):
        gone = m.delete_staged(cid, inputs[0].lower, inputs=inputs)
        log.info("compaction %s: its inputs were replaced while it read them; deleted %d output parts",
                 cid, gone.parts)
        n_in = sum(len(b.parts) for b in inputs)
        return Merge(cid, tuple(b.desc_id for b in inputs), "refused", None, 0, 0, n_in, 0, gone.parts, False)
    _abandon(shard, cid, inputs, header)
    return None


def _abandon(shard: Shard, cid: str, inputs: Sequence[st.BatchMeta], header: st.Header) -> None:
    """Delete what compaction ``cid`` staged (its manifest, its output parts so far) after its
    merge failed, before any command naming it was built; best effort (a failure is logged,
    the merge's error is what the caller sees).

    SUBTLE: the fate rule calls a compaction whose inputs are all live StillPossible, and
    rightly so for a stranger's. But ``cid`` was minted here and its command can only be
    built here, from output parts this process holds in memory, and it never was: nothing
    can ever commit it, so its fate is final CannotCommit, known without a state read. It is
    handed to the one deleter (``delete_staged(decided=...)``, through the write handle: the
    maintenance handle does not take a decided fate), which deletes only under ``cid``'s own
    prefixes. A part whose put failed yet landed is listed, and so deleted, too."""
    try:
        gone = shard.writer().delete_staged(cid, inputs[0].lower, inputs=inputs,
                                            decided=ft.CannotCommit(header.upper))
        log.info("compaction %s failed before its commit; deleted its %d output parts and %d manifests",
                 cid, gone.parts, gone.manifests)
    except (ShardsinkError, OSError) as e:  # left to the sweep: it deletes them once an input is replaced
        log.warning("compaction %s failed before its commit and its leftovers could not be deleted: %s", cid, e)


def _replaced(admin: AdminHandle, cid: str, inputs: Sequence[st.BatchMeta]) -> bool:
    return isinstance(admin.fate(cid, inputs[0].lower, inputs=inputs), ft.CannotCommit)


@dataclass(frozen=True)
class Swept:
    compaction_id: str
    fate: str
    deleted: int


def sweep(shard: Shard, *, grace_s: float = GRACE_S, now: float | None = None) -> list[Swept]:
    """Settle leftovers of crashed compactions: for each manifest older than ``grace_s``,
    delete its output if it can never apply, or just the manifest if it applied.

    Still-possible compactions (all inputs live) are left alone. Cost: one LIST of
    ``staging/`` plus, per old manifest, one fate read.
    """
    t = time.time() if now is None else now
    admin = shard.admin()
    out = []
    for o in admin.list_compaction_manifests():
        if o.modified > t - grace_s:
            continue
        got = admin.get(o.key)
        if got is None:
            continue
        cid, inputs = _inputs_of(got, f"{shard.url}/{o.key}")
        if not inputs:
            continue
        try:
            gone = admin.delete_staged(cid, inputs[0].lower, inputs=inputs)
        except ft.DeleteRefusedError:
            continue
        except ShardsinkError as e:
            log.warning("sweeping compaction %s failed: %s", cid, e)
            continue
        out.append(Swept(cid, type(gone.fate).__name__, gone.total))
    return out
