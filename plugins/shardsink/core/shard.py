"""The public shard handle: create, append, read, inspect.

Public methods validate their arguments, then delegate to the commit machine
(:mod:`shardsink.core.machine`) and the pure rules (:mod:`shardsink.core.transitions`).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core import checks as ck
from shardsink.core import fate as ft
from shardsink.core import leases as ls
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core import verdicts as vd
from shardsink.core.checks import check_as_of, check_changes
from shardsink.core.commands import AppendCommand, CreateCommand
from shardsink.core.consolidate import consolidate
from shardsink.core.machine import Head, Machine
from shardsink.core.part_io import read_parts, stage_parts
from shardsink.core.updates import COUNT, DIFF, TIME, check_schema, validate_updates
from shardsink.errors import (
    CorruptionError,
    InvalidUsageError,
    ReadFrontierError,
    ShardClosedError,
    ShardExistsError,
    UpperMismatchError,
)
from shardsink.storage.base import Blob, ObjectInfo
from shardsink.storage.url import open_blob, parse_url


def default_writer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class StagedBatch:
    """Parts written for one description but not yet committed."""

    desc_id: str
    lower: int
    upper: int | None
    parts: tuple[st.PartMeta, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)


@dataclass(frozen=True)
class AppendResult:
    status: Literal["committed", "already_committed"]
    desc_id: str
    seqno: int
    lower: int
    upper: int | None
    rows: int


@dataclass(frozen=True)
class ShardInfo:
    url: str
    seqno: int
    upper: int | None
    since: int
    schema: pa.Schema
    stats: st.Stats
    rollup: int
    last_commit: st.CommitInfo
    retention: int | None = None  # ms; None: all history


class Shard:
    """A handle on one shard. Cheap to create; holds no locks and no leases."""

    def __init__(self, url: str, *, blob: Blob | None = None, machine: Machine | None = None) -> None:
        self.url = str(parse_url(url)) if blob is None else blob.url
        self.machine = machine or Machine(blob if blob is not None else open_blob(url))

    @property
    def blob(self) -> Blob:
        return self.machine.blob

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
        out = shard.machine.commit(CreateCommand(schema, upper, writer, _now(), uuid.uuid4().hex))
        if not isinstance(out, st.Version):
            raise ShardExistsError(f"a shard already exists at {shard.machine.url}; it was left unchanged")
        return shard

    @classmethod
    def open(cls, url: str, *, blob: Blob | None = None) -> Shard:
        """A handle on an existing shard; ShardNotFoundError if there is none."""
        shard = cls(url, blob=blob)
        shard.machine.head()
        return shard

    def info(self) -> ShardInfo:
        h = self.machine.head().version
        return ShardInfo(self.url, h.seqno, h.header.upper, h.header.since, h.header.schema,
                         h.header.stats, h.header.rollup, h.commit, h.header.retention)

    @property
    def schema(self) -> pa.Schema:
        return self.machine.head().version.header.schema

    # --- writing ------------------------------------------------------------------

    def stage(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str,
              schema: pa.Schema | None = None) -> StagedBatch:
        """Validate, consolidate and write ``table`` as parts of description ``desc_id``.

        Nothing is written if the input is refused. Parts land under
        ``parts/<desc_id>/`` with fresh keys; they are invisible until committed.
        """
        ck.check_desc_id(desc_id)
        ck.check_bounds(lower, upper)
        table = ck.as_table(table)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidUsageError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        schema = schema if schema is not None else self.schema
        updates = validate_updates(table, schema, lower=lower, upper=upper)
        written = stage_parts(self.blob, updates, [*schema.names, TIME], prefix=f"parts/{desc_id}")
        return StagedBatch(desc_id, lower, upper, written)

    def compare_and_append(self, staged: Sequence[StagedBatch], *, expected_upper: int,
                           new_upper: int | None, desc_id: str, writer: str | None = None,
                           props: Mapping[str, str] | None = None) -> AppendResult:
        """Commit ``staged`` as the batch ``[expected_upper, new_upper)`` (DESIGN.md's commit).

        ``props`` (string keys and values) are recorded in the version's commit info
        (:class:`shardsink.core.state.CommitInfo`). Returns ``committed`` or
        ``already_committed`` (an earlier attempt with this ``desc_id`` landed). Raises
        UpperMismatchError (nothing committed; staged parts are left for the caller to
        :meth:`discard`), ShardClosedError, or UnknownOutcomeError (re-read before deciding).
        """
        ck.check_desc_id(desc_id)
        ck.check_bounds(expected_upper, new_upper)
        if writer is not None:
            ck.check_writer(writer)
        ck.check_props(props)
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
        return self._commit(staged, expected_upper=expected_upper, new_upper=new_upper, desc_id=desc_id,
                            writer=writer, start=self.machine.known_head(), props=props)

    def _commit(self, staged: Sequence[StagedBatch], *, expected_upper: int, new_upper: int | None,
                desc_id: str, writer: str | None, start: Head | None = None,
                props: Mapping[str, str] | None = None) -> AppendResult:
        all_parts = tuple(p for s in staged for p in s.parts)
        pairs = tuple(sorted((str(k), str(v)) for k, v in (props or {}).items()))
        cmd = AppendCommand(desc_id, expected_upper, new_upper, all_parts, writer or default_writer(),
                            _now(), uuid.uuid4().hex, pairs)
        out = self.machine.commit(cmd, start=start)
        rows = sum(p.rows for p in all_parts)
        if isinstance(out, st.Version):
            return AppendResult("committed", desc_id, out.seqno, expected_upper, new_upper, rows)
        if not isinstance(out, tr.AlreadyCommitted | tr.UpperMismatch):  # compare_and_append refuses with no other
            raise AssertionError(f"unexpected refusal of an append: {out}")
        # Committed earlier (an AlreadyCommitted from the header's window is checked for its
        # bounds), landed long ago beyond the window, lost, or: evidence gone.
        fate = ft.read_fate(self.machine, desc_id, expected_upper)
        if isinstance(fate, ft.Committed):
            return self._landed(fate, desc_id, expected_upper, new_upper)
        if isinstance(fate, ft.Unknown):
            raise vd.unknown_fate_error(self.url, desc_id, expected_upper, new_upper, fate)
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

    def _landed(self, fate: ft.Committed, desc_id: str, lower: int, upper: int | None) -> AppendResult:
        """``already_committed`` if ``desc_id`` committed these bounds; DescriptionConflictError if others."""
        vd.check_same_bounds(self.url, desc_id, fate, lower, upper)
        return AppendResult("already_committed", desc_id, fate.seqno, lower, upper, fate.rows)

    def fate(self, desc_id: str, lower: int) -> ft.Fate:
        """Committed (with its bounds and part keys), CannotCommit, StillPossible or Unknown
        (the evidence is older than the retained history), from one state read."""
        return ft.read_fate(self.machine, desc_id, ck.check_time(lower, what="lower"))

    def discard(self, staged: Sequence[StagedBatch]) -> int:
        """Delete staged parts that no committed batch references; return how many.

        Goes through the one deletion primitive (:func:`shardsink.core.fate.delete_staged`),
        which re-derives each description's fate first. SUBTLE: after a lost
        acknowledgement a description may be committed although the caller saw a failure:
        its batch's parts are kept. A description that may still commit (the shard's upper
        is not past its lower) is refused with DeleteRefusedError and nothing is deleted.
        """
        deleted = 0
        for desc_id in sorted({s.desc_id for s in staged}):
            mine = [s for s in staged if s.desc_id == desc_id]
            keys = {p.key for s in mine for p in s.parts}
            deleted += ft.delete_staged(self.machine, desc_id, min(s.lower for s in mine), only=keys,
                                        manifests=False).parts
        return deleted

    def append(self, table: pa.Table, *, lower: int, upper: int | None, desc_id: str | None = None,
               writer: str | None = None) -> AppendResult:
        """Stage and commit ``table`` as ``[lower, upper)``; on a lost race, clean up and raise.

        Idempotent under ``desc_id``: a retry after a lost acknowledgement reports
        ``already_committed`` and leaves no extra parts behind. ``desc_id=None`` mints a
        fresh id (no idempotency across calls); an empty or malformed id is refused.
        """
        # SUBTLE: only None means "mint one"; an empty id (e.g. a template that rendered to
        # nothing) is refused rather than silently losing idempotency.
        desc_id = ck.check_desc_id(uuid.uuid4().hex if desc_id is None else desc_id)
        ck.check_bounds(lower, upper)
        table = ck.as_table(table)
        if writer is not None:
            ck.check_writer(writer)
        # Uncontended, this costs what a bare commit does (4 requests): GET the hint,
        # PUT the part, create the next version (the create is the probe past the hint),
        # replace the hint. SUBTLE: the hint may be stale. Its "committed" is final; its
        # upper equal to ``lower`` only lets us stage: the commit decides on the newest
        # version. Any other hint is re-read with probing before deciding anything.
        start = self.machine.known_head()
        v = start.version
        if v.header.committed_seqno(desc_id) is None and v.header.upper != lower:
            start = self.machine.head()
            v = start.version
        head = v.header
        fate = ft.decide(ft.gather(self.machine, desc_id, lower, head=v), desc_id, lower)
        if isinstance(fate, ft.Committed):
            return self._landed(fate, desc_id, lower, upper)
        if isinstance(fate, ft.Unknown):
            raise vd.unknown_fate_error(self.url, desc_id, lower, upper, fate)
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
        staged = self.stage(table, lower=lower, upper=upper, desc_id=desc_id, schema=head.schema)
        try:
            result = self._commit([staged], expected_upper=lower, new_upper=upper, desc_id=desc_id,
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

    # --- reading ------------------------------------------------------------------

    def batches(self) -> tuple[st.BatchMeta, ...]:
        return self.machine.full_batches(self.machine.head().version)

    def leaked_parts(self, *, grace_seconds: float = 0.0) -> list[ObjectInfo]:
        """Objects under ``parts/`` that no live batch references, older than the grace period.

        SUBTLE: a part younger than the grace period may belong to an in-flight writer
        that is about to commit it; it is not reported (and must never be collected).
        Cost: one listing of ``parts/``; meant for operators and GC, not hot paths.
        """
        live = {p.key for b in self.batches() for p in b.parts}
        cutoff = time.time() - ck.check_seconds(grace_seconds, what="grace")
        return [o for o in self.blob.list("parts/") if o.key not in live and o.modified <= cutoff]

    def snapshot(self, as_of: int | None = None) -> pa.Table:
        """Consolidated contents as of ``as_of`` (default upper - 1): user columns + ``_count``.

        Requires ``since <= as_of < upper``. Raises CorruptionError on a negative count.
        """
        v = self.machine.head().version
        h = v.header
        if as_of is None:
            if h.upper is None:
                raise ReadFrontierError(f"shard {self.url} is closed; pass an explicit as_of")
            as_of = h.upper - 1
        check_as_of(self.url, h, as_of)
        wanted = [p for b in self.machine.full_batches(v) if b.lower <= as_of for p in b.parts if p.min_time <= as_of]
        data = read_parts(self.blob, wanted, h.schema)
        if any(p.max_time > as_of for p in wanted):
            data = data.filter(pc.less_equal(data[TIME], as_of))
        keys = h.schema.names
        summed = data.group_by(keys, use_threads=True).aggregate([(DIFF, "sum")])
        summed = summed.rename_columns([*keys, COUNT])
        lowest = pc.min(summed[COUNT]).as_py()
        if lowest is not None and lowest < 0:
            negative = summed.filter(pc.less(summed[COUNT], 0))
            row = negative.slice(0, 1).to_pylist()[0]
            raise CorruptionError(
                f"shard {self.url} has {negative.num_rows} rows with negative multiplicity as of {as_of}, e.g. {row}"
            )
        if lowest is None or lowest > 0:
            return summed  # nothing retracted to zero: skip copying every row through a filter
        return summed.filter(pc.greater(summed[COUNT], 0))

    def changes(self, lower: int, upper: int) -> pa.Table:
        """The consolidated updates with ``lower <= _time < upper`` (requires since <= lower).

        Times are read advanced by ``since`` (a time ``t < since`` reads as ``since``), as
        compaction may have stored them: so ``changes(since, x)`` starts with the whole
        history before ``since`` collapsed at ``since``, and the result is the same before
        and after any compaction.
        """
        v = self.machine.head().version
        h = v.header
        check_changes(self.url, h, lower, upper)
        from_start = lower <= h.since
        wanted = [
            p for b in self.machine.full_batches(v) for p in b.parts
            if (from_start or p.max_time >= lower) and p.min_time < upper
        ]
        data = read_parts(self.blob, wanted, h.schema)
        if from_start and data.num_rows:
            i = data.schema.get_field_index(TIME)
            data = data.set_column(i, data.schema.field(i),
                                   pc.max_element_wise(data[TIME], pa.scalar(h.since, pa.int64())))
        data = data.filter(pc.and_(pc.greater_equal(data[TIME], lower), pc.less(data[TIME], upper)))
        return consolidate(data, [*h.schema.names, TIME])

    def leases(self, *, now: float | None = None) -> list[ls.Lease]:
        """Live read leases (oldest first); see :mod:`shardsink.core.leases`."""
        return ls.live_leases(self, now=now)

    def min_leased_as_of(self, *, now: float | None = None) -> int | None:
        """The lowest ``as_of`` a live lease holds: compaction must keep ``since`` at or below it."""
        return ls.min_leased_as_of(self, now=now)

    def log(self, *, limit: int = 20) -> list[tuple[int, st.CommitInfo]]:
        """Commits newest first: ``(seqno, commit info)``, back to the oldest retained version.

        GC deletes versions oldest first, so the history ends at the first missing one.
        """
        ck.check_count(limit, what="log limit", lo=1)
        head = self.machine.head().version
        seqnos = range(head.seqno, max(-1, head.seqno - limit), -1)
        out = []
        for v in self.machine.fetch_upto_gap(seqnos):
            out.append((v.seqno, v.commit))
        return out
