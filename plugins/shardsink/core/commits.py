"""Commit records: what a state version stores of the command that made it.

A tagged union (:data:`Commit`), one struct per kind, each carrying its own facts under its
own names (an append's bounds, a compaction's merged range, a since advance's old and new
since, ...), never one set of fields reused with other meanings. Each record class states
what its kind does as class-level facts (:class:`CommitRecord`): readers (late-data seals,
incremental views, the batch-list replay, GC) ask those and never compare kind strings.
The commands that produce them are in :mod:`shardsink.core.commands`; the stored layout
(and how records of format 1 decode) in :mod:`shardsink.core.state_codec`.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

#: Below every int64 time and above it: the bounds of a create's and a close's seal.
MIN_TIME = -(2**63)
END_OF_TIME = 2**63


# --- commit records (stored) -------------------------------------------------------------


class Listing(msgspec.Struct, frozen=True, kw_only=True):
    """The one listing of the source that fixed a batch's input (a landing zone's mint).

    ``at``: epoch seconds on the *source store's* clock (the clock that stamps its files'
    modification times), no later than the moment the listing saw the store: every input that
    appeared before ``at`` was listed. ``held``: ``(key, appeared)`` of the inputs the listing
    holds that appeared at or after ``at`` (the same whole second on S3, or during the listing).

    The batch seals its times *as of this listing*: a source file holding those times that
    appeared at or after ``at`` and is not in ``held`` was not read by it, and is late
    (:func:`shardsink.sources.landing.files.check_late_at`).
    """

    at: float
    held: tuple[tuple[str, float], ...] = ()


class CommitRecord(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag_field="kind"):
    """Who committed, when, with which nonce; the subclasses add what their kind did.

    Class-level facts: ``changes_contents`` (a read of some time may differ before and after
    it), ``removes_batches`` (its diff removes live batches, replaced in place by what it
    adds). Whether it seals times, and which, is :meth:`sealed` (None: it seals nothing).
    """

    changes_contents: ClassVar[bool] = False
    removes_batches: ClassVar[bool] = False

    at: str
    writer: str
    nonce: str

    @property
    def kind(self) -> str:
        """The record's tag (``append``, ``compact``, ...), as stored."""
        return str(type(self).__struct_config__.tag)

    def sealed(self) -> tuple[int, int] | None:
        """The times ``[lo, hi)`` this commit sealed; None for a kind that seals nothing."""
        return None

    def batch(self) -> tuple[str, int, int | None, int] | None:
        """``(id, lower, upper, rows)`` of the batch it committed (append, close, compaction
        output), else None."""
        return None

    def describe(self) -> str:
        """What it did, in one line for operators (``shardsink log``)."""
        b = self.batch()
        assert b is not None, type(self)
        return f"{b[0]} [{b[1]}, {'∅' if b[2] is None else b[2]}) {b[3]} rows"

    def to_json(self) -> dict[str, object]:
        """The record as plain JSON values: ``kind`` and its own fields (props as an object)."""
        out: dict[str, object] = msgspec.to_builtins(self)
        if isinstance(props := out.get("props"), list):
            out["props"] = dict(props)
        return out


class SealingCommit(CommitRecord, frozen=True):
    """A kind that moves the upper and seals the times it passes (create, append, close: each
    says which in :meth:`sealed`)."""

    changes_contents: ClassVar[bool] = True


class CreateCommit(SealingCommit, frozen=True, tag="create"):
    """Version 0: the shard created at ``upper``; it seals every time below it."""

    upper: int

    def sealed(self) -> tuple[int, int] | None:
        return (MIN_TIME, self.upper)

    def describe(self) -> str:
        return f"created at upper {self.upper}"


class AppendCommit(SealingCommit, frozen=True, tag="append"):
    """The batch ``[lower, upper)`` named ``desc_id`` appended with ``rows`` updates; ``props``:
    what the writer says of how it computed it (sorted pairs, like an Iceberg snapshot summary)."""

    desc_id: str
    lower: int
    upper: int
    rows: int
    props: tuple[tuple[str, str], ...] = ()
    #: The source listing that fixed the batch's input, when its writer had one (None: sealed
    #: as of the commit's ``at``, the writer's clock).
    listing: Listing | None = None

    def sealed(self) -> tuple[int, int] | None:
        return (self.lower, self.upper)

    def batch(self) -> tuple[str, int, int | None, int] | None:
        return (self.desc_id, self.lower, self.upper, self.rows)


class CloseCommit(SealingCommit, frozen=True, tag="close"):
    """The shard closed at ``lower`` by the final batch ``desc_id`` (every later time sealed)."""

    desc_id: str
    lower: int
    rows: int
    props: tuple[tuple[str, str], ...] = ()

    def sealed(self) -> tuple[int, int] | None:
        return (self.lower, END_OF_TIME)

    def batch(self) -> tuple[str, int, int | None, int] | None:
        return (self.desc_id, self.lower, None, self.rows)


class CompactCommit(CommitRecord, frozen=True, tag="compact"):
    """Live batches ``[lower, upper)`` replaced by one merged batch ``compaction_id`` of ``rows``."""

    removes_batches: ClassVar[bool] = True

    compaction_id: str
    lower: int
    upper: int | None
    rows: int

    def batch(self) -> tuple[str, int, int | None, int] | None:
        return (self.compaction_id, self.lower, self.upper, self.rows)


class SinceCommit(CommitRecord, frozen=True, tag="since"):
    """``since`` advanced from ``old`` to ``new``."""

    old: int
    new: int

    def describe(self) -> str:
        return f"since {self.old} -> {self.new}"


class RetentionCommit(CommitRecord, frozen=True, tag="retention"):
    """The time-travel window changed from ``old`` to ``new`` ms (None: all history)."""

    old: int | None
    new: int | None

    def describe(self) -> str:
        def ms(v: int | None) -> str:
            return "all history" if v is None else f"{v} ms"
        return f"retention {ms(self.old)} -> {ms(self.new)}"


class SchemaCommit(CommitRecord, frozen=True, tag="schema"):
    """The schema evolved from id ``old_id`` to ``new_id`` by ``change`` (its description).
    A read may see other columns after it."""

    changes_contents: ClassVar[bool] = True

    old_id: int
    new_id: int
    change: str

    def describe(self) -> str:
        return f"schema {self.old_id} -> {self.new_id}: {self.change}"


class OptionCommit(CommitRecord, frozen=True, tag="option"):
    """Shard option ``name`` changed from ``old`` to ``new`` (None: not set)."""

    name: str
    old: str | None
    new: str | None

    def describe(self) -> str:
        def text(v: str | None) -> str:
            return "unset" if v is None else repr(v)
        return f"option {self.name}: {text(self.old)} -> {text(self.new)}"


#: Every stored commit record (``Version.commit``).
Commit = (CreateCommit | AppendCommit | CloseCommit | CompactCommit | SinceCommit | RetentionCommit | SchemaCommit
          | OptionCommit)
