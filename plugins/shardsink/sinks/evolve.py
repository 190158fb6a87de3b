"""Evolving a shard before a batch is written: the ingest sink's ``schema_mode="add_columns"``.

::

    evolve_for_source(shard, source, writer=...) -> [SchemaChange, ...]   (mint, after the chain)

The mint task calls it once it has minted something to write, BEFORE any write job
runs: every file the write jobs will read is checked against the shard's schema
(:func:`shardsink.sources.evolution.target_schema`), so a file that cannot be held fails
the run at once, naming the file and the column, with nothing written (no schema change,
no part). Otherwise each missing add / widening is committed as one schema command through
the one conditional put (:meth:`shardsink.core.shard.Shard.evolve`), and the write jobs,
which read the head after the mint, stage their parts under the evolved schema id. So no
batch commits rows whose columns the shard does not know. Appends staged under an older
schema id (a racing run that staged before the evolution) still commit and are read
through their own schema id (:func:`shardsink.sinks.ingest.staged_schema_id`).

SUBTLE (racing evolvers: twin mints after a retry, two runs, the CLI): each change is
re-validated by the state machine against the head it is applied to. When a racer got
there first, the machine refuses our now-duplicate ``add`` (the column exists); we then
re-read the head and recompute what is still missing (:func:`changes_to`): a racer that
added the same column with the same type (or a wider one) leaves nothing to do, which
makes the evolution idempotent; one that made the column something our files cannot be
read into is refused (SchemaMismatchError naming the column). The recomputation, not
the refusal, decides, so an evolution never applies a change that was checked against
an older schema, and two evolvers never both add a column.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.core.state import Header
from shardsink.errors import InvalidUsageError, UnknownOutcomeError
from shardsink.sources.evolution import changes_to, target_schema

log = logging.getLogger("shardsink.sinks")


def evolve_for_source(shard: Shard, source: Any, *, writer: str, header: Header | None = None,
                      desc_id: str | None = None) -> list[SchemaChange]:
    """Evolve ``shard`` to hold every file ``source`` offers (``source.file_schemas``), or raise
    SchemaMismatchError / MalformedInputError naming the file and column with nothing written.
    Returns the changes this call committed (none when the shard already holds them).
    ``header``: the shard's head as the caller read it (else one read here). ``desc_id``: the
    first description of the chain the mint just prepared (a source that plans its reads then
    reuses that mint's listing instead of listing again)."""
    files = getattr(source, "file_schemas", None)
    if files is None:
        raise InvalidUsageError(f"source {getattr(source, 'kind', type(source).__name__)!r} cannot tell its files' "
                                "schemas; schema_mode='add_columns' needs a file source (landing, files)")
    head = header if header is not None else shard.reader().head().header
    # A source that indexes its files reads their schemas from the shard's index (new files only).
    indexed: dict[str, Any] = {}
    if getattr(source, "prepare_chain", None) is not None:
        indexed = {"shard_url": shard.url, **({"desc_id": desc_id} if desc_id is not None else {})}
    target = target_schema(head.schema, files(head.schema, **indexed))
    return evolve_to(shard, target, writer=writer, header=head, what=f"the files of {source.kind} source")


def evolve_to(shard: Shard, target: pa.Schema, *, writer: str, header: Header | None = None,
              what: str = "the source") -> list[SchemaChange]:
    """Commit the adds and widenings that make ``shard`` hold ``target`` (idempotent; see the
    module docstring for the race). Returns the changes committed here."""
    head = header if header is not None else shard.reader().head().header
    done: list[SchemaChange] = []
    # Each round either commits one change or sees a racer's commit; a change list is at most
    # two per column, so the bound only trips under an endless stream of racing evolvers.
    for _ in range(2 * len(target) + 8):
        todo = changes_to(head.schema, target, what=what)
        if not todo:
            return done
        change = todo[0]
        try:
            v = shard.evolve(change, writer=writer)
        except InvalidUsageError:
            fresh = shard.reader().head().header
            if fresh.seqno == head.seqno or changes_to(fresh.schema, target, what=what)[:1] == [change]:
                raise  # no racer explains it: the change itself is refused
            head = fresh
            continue
        log.info("evolved %s: %s (schema commit seqno %d) for %s", shard.url, change.describe(), v.header.seqno, what)
        done.append(change)
        head = v.header
    raise UnknownOutcomeError(f"evolving {shard.url} for {what}: other evolvers kept changing its schema; "
                              "retry the task")
