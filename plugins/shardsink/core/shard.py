"""The public shard handle: lifecycle, the three handles, and conveniences over them.

:class:`Shard` is what pyiceberg's ``Table`` is to its ``Transaction``: it creates and opens
a shard, commits its schema changes, and hands out the handles that do the work, writes
(:meth:`Shard.writer`, :mod:`shardsink.core.write`), reads (:meth:`Shard.reader`,
:mod:`shardsink.core.read`) and maintenance (:meth:`Shard.admin`, :mod:`shardsink.core.admin`).
Its other methods (append, stage, snapshot, ...) validate and delegate to one handle. All
sit over the private commit machine (:mod:`shardsink.core.machine`) and the pure rules
(:mod:`shardsink.core.transitions`). Layers above core use the handles and never the
machine, the blob or a key (``tests/core/test_boundary.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from shardsink.core import checks as ck
from shardsink.core import fate as ft
from shardsink.core import leases as ls
from shardsink.core import state as st
from shardsink.core.admin import AdminHandle
from shardsink.core.checks import check_as_of, check_changes, check_writer
from shardsink.core.commands import CreateCommand, EvolveToCommand, SchemaCommand
from shardsink.core.commits import Commit, Listing
from shardsink.core.machine import Machine, default_writer
from shardsink.core.read import ReadHandle, SchemaChoice, ShardInfo
from shardsink.core.schema import SchemaChange, history
from shardsink.core.settle import Claim, Settled, settle
from shardsink.core.transitions import SchemaConflict, Unchanged
from shardsink.core.updates import check_schema
from shardsink.core.write import AppendResult, StagedBatch, WriteHandle
from shardsink.errors import InvalidUsageError, ShardExistsError
from shardsink.storage.base import Blob
from shardsink.storage.retry import COMMIT, STORAGE, RequestCounter, RetryingBlob
from shardsink.storage.url import open_blob, parse_url

__all__ = [
    "AppendResult", "Shard", "ShardInfo", "StagedBatch", "check_as_of", "check_changes", "default_writer",
]


class Shard:
    """A handle on one shard. Cheap to create; holds no locks and no leases."""

    def __init__(self, url: str, *, blob: Blob | None = None, machine: Machine | None = None,
                 sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None,
                 counter: RequestCounter | None = None) -> None:
        """``sleep``: what every retry of this handle's requests and commits sleeps with (its
        named policies' waits; default ``time.sleep``). A caller that must not block its thread
        (the triggerer's shared pool) passes one that raises, so a retry that would wait fails
        instead. ``clock``: the monotonic clock the handle ages the newest head it saw by
        (default ``time.monotonic``; a simulator passes its own). ``counter``: the
        :class:`~shardsink.storage.retry.RequestCounter` this handle's requests are counted by
        (default: its store's own; a benchmark passes a subclass observing each request).

        The commit machine and the store stay private (``self._machine``): layers above core,
        benchmarks and dev helpers use the handles (``tests/core/test_boundary.py``)."""
        self.url = str(parse_url(url)) if blob is None else blob.url
        store = blob if blob is not None else open_blob(url)
        if machine is None and sleep is not None:
            policy = store.policy if isinstance(store, RetryingBlob) else STORAGE
            machine = Machine(store, storage_policy=policy.with_sleep(sleep), commit_policy=COMMIT.with_sleep(sleep))
        self._machine = machine or Machine(store)
        if clock is not None:
            self._machine.clock = clock
        if counter is not None:
            self._machine.blob.counter = counter
        self._writer = WriteHandle(self.url, self._machine)
        self._reader = ReadHandle(self.url, self._machine)

    def request_counter(self) -> RequestCounter:
        """The counter of the requests this handle's store has sent (``total``, ``by_kind``; every
        attempt counts, a LIST once): what benchmarks and request-budget tests read, the cost of a
        call being the difference across it. Shared by every handle on the same store."""
        return self._machine.blob.counter

    def writer(self) -> WriteHandle:
        """The write handle: batch builder, stage, compare-and-append, commit, fate, delete_staged."""
        return self._writer

    def reader(self) -> ReadHandle:
        """The read handle: head, versions, batches, parts, snapshot, changes, leases, log."""
        return self._reader

    def admin(self) -> AdminHandle:
        """The maintenance handle (:mod:`shardsink.core.admin`): what compaction, since, GC and verify may do."""
        return AdminHandle(self._machine)

    # --- lifecycle ----------------------------------------------------------------

    @classmethod
    def create(cls, url: str, schema: pa.Schema, *, upper: int = 0, writer: str | None = None,
               blob: Blob | None = None) -> Shard:
        """Create an empty shard with ``schema`` and the given upper (since is 0)."""
        if not isinstance(schema, pa.Schema):
            raise InvalidUsageError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        check_schema(schema, what="schema")
        ck.check_time(upper, what="initial upper")
        writer = ck.check_writer(writer if writer is not None else default_writer())
        shard = cls(url, blob=blob)
        out = shard._machine.commit(CreateCommand(schema, upper), writer=writer)
        if not isinstance(out, st.Version):
            raise ShardExistsError(f"a shard already exists at {shard._machine.url}; it was left unchanged")
        return shard

    @classmethod
    def open(cls, url: str, *, blob: Blob | None = None) -> Shard:
        """A handle on an existing shard; ShardNotFoundError if there is none."""
        shard = cls(url, blob=blob)
        shard._machine.head()
        return shard

    def info(self) -> ShardInfo:
        return self._reader.info()

    @property
    def schema(self) -> pa.Schema:
        return self._reader.schema

    # --- writing (the write handle) ---------------------------------------------

    def stage(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str,
              schema: pa.Schema | None = None, order: st.PartOrder = "sorted") -> StagedBatch:
        """Validate, consolidate and write ``table`` as parts of description ``desc_id``.

        Nothing is written if the input is refused. Parts land under
        ``parts/<desc_id>/`` with fresh keys; they are invisible until committed.
        ``order="unordered"``: write the validated rows as given, without sorting or
        consolidating them (faster; every read is the same, compaction sorts them later).
        """
        return self._writer.stage(table, lower=lower, upper=upper, desc_id=desc_id, schema=schema, order=order)

    def compare_and_append(self, staged: Sequence[StagedBatch], *, expected_upper: int,
                           new_upper: int | None, desc_id: str, writer: str | None = None,
                           props: Mapping[str, str] | None = None, listing: Listing | None = None) -> AppendResult:
        """Commit ``staged`` as the batch ``[expected_upper, new_upper)``: the contract of
        :meth:`shardsink.core.write.WriteHandle.compare_and_append`."""
        return self._writer.compare_and_append(staged, expected_upper=expected_upper, new_upper=new_upper,
                                               desc_id=desc_id, writer=writer, props=props, listing=listing)

    def settle(self, claim: Claim, *, decided: ft.Fate | None = None) -> Settled:
        """Commit ``claim``'s staged batch, or say why not, deleting what its fate lets go: the one
        way a description's append is decided and carried out (:func:`shardsink.core.settle.settle`).
        Its manifests are read only when it may commit now. ``decided``: its fate as the caller
        decided it from a state version it holds (else one fresh read)."""
        return settle(self._writer, self._reader, claim, decided=decided)

    def fate(self, desc_id: str, lower: int) -> ft.Fate:
        """Committed (with its bounds and part keys), CannotCommit, StillPossible or Unknown
        (the evidence is older than the retained history), from one state read."""
        return self._writer.fate(desc_id, lower)

    def discard(self, staged: Sequence[StagedBatch]) -> int:
        """Delete staged parts that no committed batch references; return how many.

        Goes through the one deletion primitive (:func:`shardsink.core.fate.delete_staged`),
        which re-derives each description's fate first. SUBTLE: after a lost
        acknowledgement a description may be committed although the caller saw a failure:
        its batch's parts are kept. A description that may still commit (the shard's upper
        is not past its lower) is refused with DeleteRefusedError and nothing is deleted.
        """
        return self._writer.discard(staged)

    def append(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str | None = None,
               writer: str | None = None, schema: pa.Schema | None = None) -> AppendResult:
        """Stage and commit ``table`` as ``[lower, upper)``; on a lost race, clean up and raise.

        Idempotent under ``desc_id``: a retry after a lost acknowledgement reports
        ``already_committed`` and leaves no extra parts behind. ``desc_id=None`` mints a
        fresh id (no idempotency across calls); an empty or malformed id is refused.
        Uncontended it costs what a bare commit does (4 requests). ``schema``: the schema the
        rows are validated and labelled with, as in :meth:`stage` (None: the shard's current one).
        """
        return self._writer.append(table, lower=lower, upper=upper, desc_id=desc_id, writer=writer, schema=schema)

    def close(self, *, expected_upper: int, desc_id: str | None = None, writer: str | None = None) -> AppendResult:
        """Seal the shard for good: its upper becomes the empty frontier."""
        return self._writer.close(expected_upper=expected_upper, desc_id=desc_id, writer=writer)

    # --- reading (the read handle) ----------------------------------------------

    def batches(self) -> tuple[st.BatchMeta, ...]:
        return self._reader.batches()

    def snapshot(self, as_of: int | None = None, *, schema: SchemaChoice = "current") -> pa.Table:
        """Consolidated contents as of ``as_of`` (default upper - 1): user columns + ``_count``.

        Requires ``since <= as_of < upper``. Raises CorruptionError on a negative count.
        ``schema``: project onto the current schema, or (``"as_of"``) the one current at ``as_of``.
        """
        return self._reader.snapshot(as_of, schema=schema)

    def changes(self, lower: int, upper: int, *, schema: SchemaChoice = "current") -> pa.Table:
        """The consolidated updates with ``lower <= _time < upper`` (requires since <= lower).

        Times below ``since`` read as ``since`` (see :meth:`shardsink.core.read.ReadHandle.changes`).
        """
        return self._reader.changes(lower, upper, schema=schema)

    def schema_history(self) -> tuple[st.SchemaEntry, ...]:
        """The schema history, oldest first (:func:`shardsink.core.schema.history`)."""
        return history(self._reader.head().header)

    def evolve(self, change: SchemaChange, *, writer: str | None = None) -> st.Version:
        """Commit one schema change (:class:`shardsink.core.schema.SchemaChange`) through the one
        conditional put; InvalidUsageError (nothing written) if the change is not allowed."""
        if not isinstance(change, SchemaChange):
            raise InvalidUsageError(f"change must be a SchemaChange, got {type(change).__name__}")
        if writer is not None:
            check_writer(writer)
        out = self._machine.commit(SchemaCommand(change), writer=writer)
        if not isinstance(out, st.Version):
            raise AssertionError(f"unexpected refusal of a schema change: {out}")
        return out

    def evolve_to(self, target: pa.Schema, *, exact: bool = False, writer: str | None = None
                  ) -> st.Version | Unchanged | SchemaConflict:
        """Make the schema hold ``target`` in one commit (:class:`shardsink.core.commands.EvolveToCommand`):
        the version it made, Unchanged (with the schema id holding it) when already held, or
        SchemaConflict (nothing written) when the current schema cannot get there; racers are
        settled by the one commit loop, so callers never loop. InvalidUsageError for a bad target."""
        if not isinstance(target, pa.Schema) or not isinstance(exact, bool):
            raise InvalidUsageError(f"target must be a pyarrow Schema and exact a bool, got {type(target).__name__} "
                                    f"and {exact!r:.40}")
        check_schema(target, what="the target schema")
        if writer is not None:
            check_writer(writer)
        out = self._machine.commit(EvolveToCommand(target=target, exact=exact), writer=writer)
        if not isinstance(out, st.Version | Unchanged | SchemaConflict):
            raise AssertionError(f"unexpected refusal of a schema target: {out}")
        return out

    def leases(self, *, now: float | None = None) -> list[ls.Lease]:
        """Live read leases (oldest first); see :mod:`shardsink.core.leases`."""
        return self._reader.leases(now=now)

    def min_leased_as_of(self, *, now: float | None = None) -> int | None:
        """The lowest ``as_of`` a live lease holds: compaction must keep ``since`` at or below it."""
        return self._reader.min_leased_as_of(now=now)

    def log(self, *, limit: int = 20) -> list[tuple[int, Commit]]:
        """Commits newest first: ``(seqno, commit info)``, back to the oldest retained version.

        GC deletes versions oldest first, so the history ends at the first missing one.
        """
        return self._reader.log(limit=limit)
