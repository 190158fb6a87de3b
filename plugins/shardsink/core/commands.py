"""The commit as data: every kind of state transition, as a command and the record it leaves.

A **command** is a frozen value describing one intended transition; nothing here reads or
writes. :func:`shardsink.core.transitions.apply` turns (header, command, stamp) into the
next version or a typed refusal, and ``Machine.commit`` is the one compare-and-set loop
that commits any command, stamping it (:class:`Stamp`: writer, time, nonce) once per call.

Each command leaves a **commit record** in the version it makes (:mod:`shardsink.core.commits`).
Adding a kind: its command here and its record there (both union members), its rule
registered in :mod:`shardsink.core.transitions`, and its caller (a handle or a maintenance
wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import pyarrow as pa

from shardsink.core.commits import Listing
from shardsink.core.schema import SchemaChange
from shardsink.core.state import PartMeta

#: Which handle may commit a command: ``create`` (Shard.create), ``append`` (WriteHandle),
#: ``maintenance`` (AdminHandle), ``schema`` (Shard.evolve, Shard.evolve_to).
Family = Literal["create", "append", "maintenance", "schema"]


@dataclass(frozen=True)
class Stamp:
    """Who commits, when (ISO UTC), and the one call's ``nonce``: set once per
    ``Machine.commit`` call, so a re-applied command after an unknown outcome produces the
    same bytes and our own version is recognised by its nonce."""

    writer: str
    at: str
    nonce: str


# --- commands ------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateCommand:
    """Create version 0 of a new shard with ``schema`` at ``upper`` (since 0, no batches).

    Its precondition is that no version exists: the create of version 0 is the conditional put.
    """

    family: ClassVar[Family] = "create"
    needs_batches: ClassVar[bool] = False

    schema: pa.Schema
    upper: int


@dataclass(frozen=True)
class AppendCommand:
    """Append ``parts`` as the batch ``[lower, upper)`` named ``desc_id``; ``upper=None`` closes
    the shard. ``props`` go to the record unchanged. ``schema_id``: the schema the parts were
    staged with (:mod:`shardsink.core.schema`); the commit refuses an id the shard does not
    know (InvalidUsageError). None: the shard's current schema at commit.

    SUBTLE: None is only right for a writer that staged with the schema current at commit;
    a schema change between staging and commit would then mislabel its parts. Writers that
    read the schema themselves pass the id they read it under.
    """

    family: ClassVar[Family] = "append"
    needs_batches: ClassVar[bool] = False

    desc_id: str
    lower: int
    upper: int | None
    parts: tuple[PartMeta, ...]
    props: tuple[tuple[str, str], ...] = ()
    schema_id: int | None = None
    #: The source listing that fixed the batch's input (recorded on the append's record).
    listing: Listing | None = None


@dataclass(frozen=True)
class CompactCommand:
    """Replace the live, adjacent batches ``inputs`` by one batch of ``parts``.

    ``compaction_id`` names the output (its parts live under ``parts/<compaction_id>/``)
    and is recorded in ``header.recent`` like a description id, so the compaction's fate
    is decidable (``core.fate``). ``since`` is the frontier the output was consolidated
    at: every time below it was advanced to it; it must not exceed the shard's since.
    ``lower``/``upper`` are the merged bounds (the first input's lower, the last's upper).
    """

    family: ClassVar[Family] = "maintenance"
    needs_batches: ClassVar[bool] = True  # its rule re-checks that the inputs are live

    compaction_id: str
    inputs: tuple[str, ...]
    lower: int
    upper: int | None
    since: int
    parts: tuple[PartMeta, ...]
    schema_id: int | None = None  # the schema the merge wrote (None: the current one)


@dataclass(frozen=True)
class SinceCommand:
    """Advance ``since`` to ``min(upper - retention, lease_cap, target)`` (never backwards).

    ``lease_cap`` is the lowest ``as_of`` of the live leases listed just before the
    commit (None: no lease). ``target`` is an explicit ceiling (None: retention only).
    With no retention and no target nothing moves. ``since`` never passes ``upper - 1``
    while the shard is open, so the newest time stays readable.
    """

    family: ClassVar[Family] = "maintenance"
    needs_batches: ClassVar[bool] = False

    lease_cap: int | None
    target: int | None


@dataclass(frozen=True)
class RetentionCommand:
    """Set the shard's time-travel window to ``retention`` ms (None: keep all history)."""

    family: ClassVar[Family] = "maintenance"
    needs_batches: ClassVar[bool] = False

    retention: int | None


@dataclass(frozen=True)
class OptionCommand:
    """Set shard option ``name`` to ``value`` (None: unset it). Core only records it: a capability
    above core reads it (:meth:`shardsink.core.state.Header.option`)."""

    family: ClassVar[Family] = "maintenance"
    needs_batches: ClassVar[bool] = False

    name: str
    value: str | None


@dataclass(frozen=True)
class SchemaCommand:
    """Evolve the shard's schema by one :class:`shardsink.core.schema.SchemaChange`.

    Validated against the head it is applied to (after a lost race, the fresh one), so two
    racing changes never combine into one that was not checked. A refused change raises
    InvalidUsageError and writes nothing.
    """

    family: ClassVar[Family] = "schema"
    needs_batches: ClassVar[bool] = False

    change: SchemaChange


@dataclass(frozen=True, kw_only=True)
class EvolveToCommand:
    """Evolve the shard's schema so that it holds ``target`` (its user columns): the adds and
    widenings :func:`shardsink.core.schema.changes_to` plans from the current schema of the
    head the command is applied to, committed together as ONE new schema id.

    Idempotent by construction: applied (after a lost race, re-applied) on the fresh head, a
    target some racer already made the shard hold is ``Unchanged`` (nothing written), and a
    head whose schema cannot get there (a racer made a column something else) is the typed
    refusal ``SchemaConflict``; no caller loops. ``exact``: the writer staged parts under
    ``target`` itself, so some schema id must equal it (the new one, or an existing one when
    the head already holds it); a head that would evolve to anything else (a racer added a
    column, dropped one, or widened further) is a SchemaConflict too.
    """

    family: ClassVar[Family] = "schema"
    needs_batches: ClassVar[bool] = False

    target: pa.Schema
    exact: bool = False


#: Every state transition: what ``transitions.apply`` dispatches on and ``Machine.commit`` commits.
Command = (CreateCommand | AppendCommand | CompactCommand | SinceCommand | RetentionCommand | SchemaCommand
           | EvolveToCommand | OptionCommand)
