"""The typed refusals of the pure transitions (:mod:`shardsink.core.transitions`): why a command
wrote nothing. Re-exported by :mod:`shardsink.core.transitions`, where callers name them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlreadyCommitted:
    seqno: int


@dataclass(frozen=True)
class UpperMismatch:
    current: int | None


@dataclass(frozen=True)
class InputsGone:
    """A compaction refused: these input batches are no longer live (another compaction
    replaced them). It can never apply; its output must be deleted by its fate."""

    missing: tuple[str, ...]


@dataclass(frozen=True)
class Unchanged:
    """A command that would change nothing (``since`` already there, same retention, a schema
    target the shard already holds): no version is written. ``schema_id``: for a schema
    target, the id of the schema that holds it."""

    reason: str
    schema_id: int | None = None


@dataclass(frozen=True)
class SchemaConflict:
    """An evolve-to-target refused: the head's current schema ``schema_id`` cannot reach the
    target (column ``column``: ``reason``), since someone made the column something else.
    Nothing is written; retrying cannot help. The caller refuses its run with its own error
    class (its input must change, or the schema be fixed by hand)."""

    schema_id: int
    column: str
    reason: str


@dataclass(frozen=True)
class AlreadyExists:
    """A create refused: a shard (some state version, or the hint) is already there."""


Refusal = AlreadyCommitted | UpperMismatch | InputsGone | Unchanged | AlreadyExists | SchemaConflict
