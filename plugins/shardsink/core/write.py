"""The write handle: stage parts, commit, decide a description's fate, delete what it staged.

:class:`WriteHandle` (from :meth:`shardsink.core.shard.Shard.writer`) is every write a layer
above core makes to a shard, as persist's ``write.rs`` sits over its private machine: parts
through the one batch builder (:mod:`shardsink.core.builder`), commits through the one
compare-and-set loop (:meth:`shardsink.core.machine.Machine.commit`), fates from one state
read (:mod:`shardsink.core.fate`), deletions through the one deleter
(:func:`shardsink.core.fate.delete_staged`), and a description's staging manifests. Callers
never see the machine, the blob or a key: the handle owns the layout
(:mod:`shardsink.core.keys`). A process holding no handle (a Spark executor) writes parts
from the picklable spec :meth:`WriteHandle.part_writer` hands out.

Contract: the handle holds no lock and no lease; it shares its machine (and so the head it
last saw, :meth:`Machine.known_head`) with the :class:`~shardsink.core.shard.Shard` it came
from and that shard's read handle.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import pyarrow as pa

from shardsink.core import checks as ck
from shardsink.core import fate as ft
from shardsink.core import keys
from shardsink.core import manifests as mf
from shardsink.core import schema as sch
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.builder import DEFAULT_PART_OPTIONS, BatchBuilder, PartOptions, PartWriterSpec, check_label
from shardsink.core.commands import AppendCommand
from shardsink.core.commits import Listing
from shardsink.core.diff_sums import check_input_sums
from shardsink.core.machine import Head, Machine
from shardsink.core.part_io import TARGET_PART_BYTES, PartEncoding
from shardsink.core.updates import TIME, validate_updates
from shardsink.errors import InvalidUsageError, ShardClosedError, ShardNotFoundError, UpperMismatchError


@dataclass(frozen=True)
class StagedBatch:
    """Parts written for one description but not yet committed."""

    desc_id: str
    lower: int
    upper: int | None
    parts: tuple[st.PartMeta, ...]
    #: The shard's schema id the rows were validated and written with (None: a schema the
    #: shard did not know at staging; the commit then labels it with the current schema).
    schema_id: int | None = None

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)


@dataclass(frozen=True)
class AppendResult:
    """``committed``: this call's conditional put made the commit; ``already_committed``: an
    earlier attempt with the same ``desc_id`` did (a lost acknowledgement, a twin). ``writer``
    and ``at`` (ISO time): who committed it and when, as the committing version's record says
    (None: decided from a record beyond the retained history)."""

    status: Literal["committed", "already_committed"]
    desc_id: str
    seqno: int
    lower: int
    upper: int | None
    rows: int
    writer: str | None = None
    at: str | None = None


class WriteHandle:
    """Writes to the shard at ``url`` through its (private) commit machine."""

    def __init__(self, url: str, machine: Machine) -> None:
        self.url = url
        self._machine = machine

    # --- staging ------------------------------------------------------------------

    def builder(self, desc_id: str, *, label: str | None = None,
                options: PartOptions = DEFAULT_PART_OPTIONS) -> BatchBuilder:
        """A batch builder writing parts of ``desc_id`` (fresh keys under the prefix it owns)."""
        return BatchBuilder(self._machine.blob, ck.check_desc_id(desc_id), label=check_label(label),
                            options=_check_options(options))

    def part_writer(self, desc_id: str, *, label: str | None = None, order: st.PartOrder = "sorted",
                    encoding: PartEncoding = "default", target_bytes: int = TARGET_PART_BYTES,
                    threads: int | None = 1, dry_run: bool = False, schema: pa.Schema | None = None,
                    at: st.Version | None = None) -> PartWriterSpec:
        """A picklable spec of :meth:`builder` for a process holding no handle (a Spark executor):
        :meth:`PartWriterSpec.open` there gives the builder, opening the store with that process's
        environment. ``order``, ``encoding``, ``target_bytes``, ``threads``: the
        :class:`~shardsink.core.builder.PartOptions` (``threads`` 1: a Spark task owns one core).
        ``dry_run``: the builder encodes parts but uploads nothing. ``schema``: the user columns the
        parts are staged with; when the shard knows it, every part carries its field ids. ``at``: the
        version the caller works from, whose schemas give the ids (no request); None: the handle's
        known head (a request for a fresh handle). A bad value: InvalidUsageError naming it."""
        entry = None
        if isinstance(schema, pa.Schema):
            try:
                header: st.Header | None = (at if at is not None else self._machine.known_head().version).header
            except ShardNotFoundError:  # a view's first write stages before it creates its output shard
                header = None
            sid = sch.id_of(header, schema) if header is not None else None
            entry = sch.entry(header, sid) if header is not None and sid is not None else None
        try:
            options = PartOptions(target_bytes=target_bytes, encoding=encoding, threads=threads, order=order,
                                  field_ids=sch.parquet_field_ids(entry) if entry is not None else ())
        except ValueError as e:
            raise InvalidUsageError(f"part writer of description {desc_id!r:.130}: {e}") from None
        return PartWriterSpec(url=self.url, desc_id=desc_id, label=label, options=options, dry_run=dry_run)

    def parts_prefix(self, desc_id: str, *, label: str | None = None) -> str:
        """Where ``desc_id``'s parts live (no trailing slash; every part key of the description,
        labelled ones included, starts with this plus ``/``)."""
        return keys.parts_prefix(ck.check_desc_id(desc_id), label=check_label(label))

    def manifest_key(self, desc_id: str, slot: int) -> str:
        """The key of slot ``slot``'s manifest of ``desc_id`` (how errors name it)."""
        return keys.manifest_key(ck.check_desc_id(desc_id), ck.check_count(slot, what="slot"))

    def stage(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str,
              schema: pa.Schema | None = None, label: str | None = None,
              options: PartOptions = DEFAULT_PART_OPTIONS, order: st.PartOrder | None = None) -> StagedBatch:
        """Validate, consolidate and write ``table`` as parts of description ``desc_id``.

        Nothing is written if the input is refused. Parts land under the description's
        prefix with fresh keys; they are invisible until committed. ``schema`` None: the
        shard's (one head read). ``order`` (None: ``options.order``): ``"sorted"`` parts are
        consolidated and sorted; ``"unordered"`` parts hold the validated rows as given (no
        sort, no consolidation; reads are the same, compaction sorts them later).
        """
        ck.check_desc_id(desc_id)
        ck.check_bounds(lower, upper)
        table = ck.as_table(table)
        if order is not None:
            if order not in st.PART_ORDERS:
                raise InvalidUsageError(f"order must be 'sorted' or 'unordered', got {order!r}", value=str(order))
            options = replace(options, order=order)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidUsageError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        schema_id: int | None
        if schema is None:
            header = self._machine.head().version.header
            schema, schema_id = header.schema, sch.current(header).id
        else:
            schema_id = sch.id_of(self._machine.known_head().version.header, schema)
            if schema_id is None:
                schema_id = sch.id_of(self._machine.head().version.header, schema)
        updates = validate_updates(table, schema, lower=lower, upper=upper)
        check_input_sums(updates, [*schema.names, TIME], what="the appended table")
        entry = sch.entry(self._machine.known_head().version.header, schema_id) if schema_id is not None else None
        if entry is not None and not options.field_ids:  # the parts carry the shard schema's field ids
            options = replace(options, field_ids=sch.parquet_field_ids(entry))
        written = self.builder(desc_id, label=label, options=options).stage(updates, [*schema.names, TIME])
        return StagedBatch(desc_id, lower, upper, written, schema_id)

    # --- manifests ----------------------------------------------------------------

    def put_manifest(self, doc: mf.ManifestDoc | mf.CompactionManifestDoc) -> str:
        """Publish a staging manifest (a plain put: a retried attempt replaces it); returns its key."""
        key = (keys.manifest_key(doc.desc_id, doc.slot) if isinstance(doc, mf.ManifestDoc)
               else keys.compaction_manifest_key(doc.compaction_id))
        self._machine.blob.put(key, mf.encode(doc))
        return key

    def get_manifest(self, desc_id: str, slot: int) -> mf.ManifestDoc | None:
        """Slot ``slot``'s manifest of ``desc_id``; None if missing, CorruptionError (naming
        the object) if unreadable."""
        key = keys.manifest_key(desc_id, slot)
        got = self._machine.blob.get(key)
        return None if got is None else mf.decode_manifest(got.data, where=key)

    def list_staged(self, desc_id: str) -> frozenset[str]:
        """The keys of every part present under ``desc_id``'s prefix (labelled sub-folders included)."""
        prefix = keys.staged_prefixes(desc_id)[0]
        return frozenset(o.key for o in self._machine.blob.list(prefix))

    # --- committing ---------------------------------------------------------------

    def commit(self, command: AppendCommand, *, writer: str | None = None) -> st.Version | tr.Refusal:
        """Commit an append-family command (an append or a close) through the one
        compare-and-set loop: the next version, or a typed refusal (nothing written). Decides
        on a fresh head read (then re-decides on every newer head after a lost race). Other
        kinds are committed by their own handles (InvalidUsageError naming the kind here)."""
        if not isinstance(command, AppendCommand):
            family = getattr(type(command), "family", None)
            raise InvalidUsageError(f"a write handle commits appends and closes, not {type(command).__name__} "
                                    f"(family {family!r}: " + _FAMILY_HANDLES.get(str(family), "not a command")
                                    + ")", value=type(command).__name__)
        return self._machine.commit(command, writer=ck.check_writer(writer) if writer is not None else None)

    def compare_and_append(self, staged: Sequence[StagedBatch], *, expected_upper: int,
                           new_upper: int | None, desc_id: str, writer: str | None = None,
                           props: Mapping[str, str] | None = None, listing: Listing | None = None) -> AppendResult:
        """Commit ``staged`` as the batch ``[expected_upper, new_upper)`` (DESIGN.md's commit).

        ``props`` (string keys and values) are recorded in the version's commit info
        (:class:`shardsink.core.commits.AppendCommit`), and so is ``listing``, the source
        listing that fixed the batch's input (:class:`shardsink.core.commits.Listing`: its
        times are sealed as of that listing). Returns ``committed`` or
        ``already_committed`` (an earlier attempt with this ``desc_id`` landed). Raises
        UpperMismatchError (nothing committed; staged parts are left for the caller to
        :meth:`discard`), ShardClosedError, or UnknownOutcomeError (re-read before deciding).
        """
        ck.check_desc_id(desc_id)
        ck.check_bounds(expected_upper, new_upper)
        if writer is not None:
            ck.check_writer(writer)
        ck.check_props(props)
        ck.check_listing(listing)
        if isinstance(staged, StagedBatch) or not all(isinstance(s, StagedBatch) for s in staged):
            raise InvalidUsageError("staged must be a sequence of StagedBatch (from Shard.stage)")
        for s in staged:
            if (s.lower, s.upper) != (expected_upper, new_upper) or s.desc_id != desc_id:
                raise InvalidUsageError(
                    f"staged batch {s.desc_id} [{s.lower}, {s.upper}) does not belong to description "
                    f"{desc_id} [{expected_upper}, {new_upper})"
                )
        # A handle that just committed or read the head starts from it (2 requests uncontended);
        # a stale start costs a failed create, never a wrong commit (Machine.commit).
        return self._append(staged, expected_upper=expected_upper, new_upper=new_upper, desc_id=desc_id,
                            writer=writer, start=self._machine.known_head(), props=props, listing=listing)

    def _append(self, staged: Sequence[StagedBatch], *, expected_upper: int, new_upper: int | None,
                desc_id: str, writer: str | None, start: Head | None = None,
                props: Mapping[str, str] | None = None, listing: Listing | None = None) -> AppendResult:
        all_parts = tuple(p for s in staged for p in s.parts)
        pairs = tuple(sorted((str(k), str(v)) for k, v in (props or {}).items()))
        ids = {s.schema_id for s in staged if s.parts}
        if len(ids) > 1:
            raise InvalidUsageError(f"staged batches of description {desc_id} were written with different schema ids "
                                    f"{sorted(ids, key=str)}; stage them with one schema")
        cmd = AppendCommand(desc_id, expected_upper, new_upper, all_parts, pairs, next(iter(ids), None), listing)
        out = self._machine.commit(cmd, writer=writer, start=start)
        rows = sum(p.rows for p in all_parts)
        if isinstance(out, st.Version):
            return AppendResult("committed", desc_id, out.seqno, expected_upper, new_upper, rows, out.commit.writer,
                                out.commit.at)
        if not isinstance(out, tr.AlreadyCommitted | tr.UpperMismatch):  # compare_and_append refuses with no other
            raise AssertionError(f"unexpected refusal of an append: {out}")
        # Committed earlier (an AlreadyCommitted from the header's window is checked for its
        # bounds), landed long ago beyond the window, lost, or: evidence gone.
        fate = ft.read_fate(self._machine, desc_id, expected_upper)
        if isinstance(fate, ft.Committed):
            return self.already_committed(fate, desc_id, expected_upper, new_upper)
        if isinstance(fate, ft.Unknown):
            raise ft.unknown_fate_error(self.url, desc_id, expected_upper, new_upper, fate)
        if not isinstance(out, tr.UpperMismatch):  # window said committed, the fate cannot disagree
            raise AssertionError(f"description {desc_id} is in the idempotency window but its fate is {fate}")
        if out.current is None:
            raise ShardClosedError(f"shard {self.url} is closed; it accepts no appends")
        raise UpperMismatchError(
            f"upper mismatch on {self.url}: expected upper {expected_upper}, current upper {out.current}; "
            f"description {desc_id} was not committed",
            expected=expected_upper,
            current=out.current,
        )

    def already_committed(self, fate: ft.Committed, desc_id: str, lower: int, upper: int | None) -> AppendResult:
        """The ``already_committed`` result of ``desc_id`` from its Committed fate, if it committed these
        bounds; DescriptionConflictError if others (an id names one description)."""
        ft.check_same_bounds(self.url, desc_id, fate, lower, upper)
        return AppendResult("already_committed", desc_id, fate.seqno, lower, upper, fate.rows, fate.writer, fate.at)

    def append(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str | None = None,
               writer: str | None = None, schema: pa.Schema | None = None) -> AppendResult:
        """Stage and commit ``table`` as ``[lower, upper)``; on a lost race, clean up and raise
        (see :meth:`shardsink.core.shard.Shard.append`). ``schema``: as :meth:`stage` (None:
        the shard's current schema)."""
        # SUBTLE: only None means "mint one"; an empty id (e.g. a template that rendered to
        # nothing) is refused rather than silently losing idempotency.
        desc_id = ck.check_desc_id(uuid.uuid4().hex if desc_id is None else desc_id)
        ck.check_bounds(lower, upper)
        table = ck.as_table(table)
        if writer is not None:
            ck.check_writer(writer)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidUsageError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        # Uncontended, this costs what a bare commit does (4 requests): GET the hint,
        # PUT the part, create the next version (the create is the probe past the hint),
        # replace the hint. SUBTLE: the hint may be stale. Its "committed" is final; its
        # upper equal to ``lower`` only lets us stage: the commit decides on the newest
        # version. Any other hint is re-read with probing before deciding anything.
        start = self._machine.known_head()
        v = start.version
        if v.header.committed_seqno(desc_id) is None and v.header.upper != lower:
            start = self._machine.head()
            v = start.version
        head = v.header
        fate = self.fate(desc_id, lower, head=v)
        if isinstance(fate, ft.Committed):
            return self.already_committed(fate, desc_id, lower, upper)
        if isinstance(fate, ft.Unknown):
            raise ft.unknown_fate_error(self.url, desc_id, lower, upper, fate)
        if head.upper is None:
            raise ShardClosedError(f"shard {self.url} is closed; it accepts no appends")
        if head.upper != lower:
            # Refused before staging: nothing to clean up, and a lower above the upper (still
            # possible later) never leaves parts that could not be deleted safely.
            raise UpperMismatchError(
                f"upper mismatch on {self.url}: expected upper {lower}, current upper {head.upper}; "
                f"description {desc_id} was not committed",
                expected=lower, current=head.upper,
            )
        staged = self.stage(table, lower=lower, upper=upper, desc_id=desc_id,
                            schema=head.schema if schema is None else schema)
        try:
            result = self._append([staged], expected_upper=lower, new_upper=upper, desc_id=desc_id,
                                  writer=writer, start=start)
        except (UpperMismatchError, ShardClosedError):
            self.discard([staged])
            raise
        if result.status == "already_committed":
            self.discard([staged])
        return result

    def close(self, *, expected_upper: int, desc_id: str | None = None, writer: str | None = None) -> AppendResult:
        """Seal the shard for good: its upper becomes the empty frontier."""
        return self.compare_and_append([], expected_upper=expected_upper, new_upper=None,
                                       desc_id=uuid.uuid4().hex if desc_id is None else desc_id, writer=writer)

    # --- fate and deletion --------------------------------------------------------

    def fate(self, desc_id: str, lower: int, *, inputs: Sequence[st.BatchMeta] | None = None,
             head: st.Version | None = None) -> ft.Fate:
        """Committed (with its bounds and part keys), CannotCommit, StillPossible or Unknown
        (the evidence is older than the retained history), from ONE state read: ``head`` if
        the caller already read it (:meth:`shardsink.core.read.ReadHandle.head`), else a fresh
        one. ``inputs`` given: ``desc_id`` is a compaction id and these its input batches."""
        lower = ck.check_time(lower, what="lower")
        if inputs is not None:
            return ft.decide(ft.gather_compaction(self._machine, desc_id, inputs, head=head), desc_id, lower)
        return ft.decide(ft.gather(self._machine, desc_id, lower, head=head), desc_id, lower)

    def delete_staged(self, desc_id: str, lower: int, *, only: Collection[str] | None = None,
                      manifests: bool = True, inputs: Sequence[st.BatchMeta] | None = None,
                      decided: ft.Committed | ft.CannotCommit | ft.Unknown | None = None) -> ft.Deleted:
        """Delete what ``desc_id`` staged and its fate lets go: THE deleting primitive
        (:func:`shardsink.core.fate.delete_staged`), which re-derives the fate from a fresh
        read first. Raises DeleteRefusedError (nothing deleted) while it may still commit;
        an Unknown fate deletes only what nothing retained references (see there). ``decided``:
        a final fate this task already decided from a state version (no second read; see there)."""
        return ft.delete_staged(self._machine, desc_id, lower, only=only, manifests=manifests, inputs=inputs,
                                decided=decided)

    def discard(self, staged: Sequence[StagedBatch], *, unpublished: bool = False) -> int:
        """Delete staged parts that no committed batch references; return how many.

        Goes through :meth:`delete_staged`, which re-derives each description's fate first.
        SUBTLE: after a lost acknowledgement a description may be committed although the
        caller saw a failure: its batch's parts are kept. A description that may still
        commit (the shard's upper is not past its lower) is refused with DeleteRefusedError
        and nothing is deleted, unless ``unpublished``: the caller vouches that it wrote these
        parts itself and never handed them out (e.g. a staging that failed after its
        uploads), so no commit can reference them (``unpublished`` of
        :func:`shardsink.core.fate.delete_staged`).
        """
        if isinstance(staged, StagedBatch) or not all(isinstance(s, StagedBatch) for s in staged):
            raise InvalidUsageError("staged must be a sequence of StagedBatch")
        deleted = 0
        for desc_id in sorted({s.desc_id for s in staged}):
            mine = [s for s in staged if s.desc_id == desc_id]
            only = {p.key for s in mine for p in s.parts}
            lower = min(s.lower for s in mine)
            deleted += ft.delete_staged(self._machine, desc_id, lower, only=only, manifests=False,
                                        unpublished=unpublished).parts
        return deleted


#: Which handle commits each family of command (the refusal of :meth:`WriteHandle.commit` says).
_FAMILY_HANDLES = {"create": "Shard.create commits it", "maintenance": "the admin handle commits it",
                   "schema": "Shard.evolve commits it"}


def _check_options(options: object) -> PartOptions:
    if not isinstance(options, PartOptions):
        raise InvalidUsageError(f"options must be a PartOptions, got {type(options).__name__}")
    return options
