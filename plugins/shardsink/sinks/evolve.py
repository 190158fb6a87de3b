"""Evolving a shard before a batch is written: the ingest sink's ``schema_mode="add_columns"``.

::

    evolve_for_source(shard, source, writer=...) -> [SchemaChange, ...]   (mint, after the chain)

The mint task calls it once it has minted something to write, BEFORE any write job
runs: every file the write jobs will read (:func:`shardsink.sources.evolution.run_file_schemas`)
is checked against the shard's schema (:func:`shardsink.sources.evolution.target_schema`), so a
file that cannot be held fails the run at once, naming the file and the column, with nothing
written (no schema change, no part). Otherwise the target schema is committed as ONE
evolve-to-target command (:meth:`shardsink.core.shard.Shard.evolve_to`: its missing adds and
widenings, one new schema id), and the write jobs, which read the head after the mint, stage
their parts under the evolved schema id. So no batch commits rows whose columns the shard
does not know. Appends staged under an older schema id (a racing run that staged before the
evolution) still commit and are read through their own schema id
(:func:`shardsink.core.staged.staged_schema_id`).

SUBTLE (racing evolvers: twin mints after a retry, two runs, the CLI): the command carries
the target, not the changes, and its rule plans them on the head it is applied to, by the
one commit loop (after a lost race, on the fresh head). A racer that already made the shard
hold the target (the same column, or a wider type) leaves it Unchanged: nothing written,
both evolvers succeed. One that made a column something the files cannot be read into is
the typed refusal SchemaConflict, raised here as SchemaMismatchError naming the column.
No loop here, and no error is read as a sign of a race.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from shardsink.core import schema as sc
from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.core.state import Header
from shardsink.core.transitions import SchemaConflict, Unchanged
from shardsink.sources.evolution import mismatch, run_file_schemas, target_schema

log = logging.getLogger("shardsink.sinks")


def evolve_for_source(shard: Shard, source: Any, *, writer: str, header: Header | None = None,
                      desc_id: str | None = None) -> list[SchemaChange]:
    """Evolve ``shard`` to hold every file ``source`` offers, or raise SchemaMismatchError /
    MalformedInputError naming the file and column with nothing written (InvalidUsageError for
    a source that cannot tell its files' schemas). Returns the changes this call committed
    (none when the shard already holds them). ``header``: the shard's head as the caller read
    it (else one read here; the commit plans on the fresh head either way). ``desc_id``: the
    first description of the chain the mint just prepared (a source that plans its reads then
    reuses that mint's listing instead of listing again)."""
    head = header if header is not None else shard.reader().head().header
    files = run_file_schemas(source, head.schema, shard_url=shard.url, desc_id=desc_id)
    target = target_schema(head.schema, files)
    return evolve_to(shard, target, writer=writer, what=f"the files of {source.kind} source")


def evolve_to(shard: Shard, target: pa.Schema, *, writer: str, what: str = "the source") -> list[SchemaChange]:
    """Make ``shard`` hold ``target`` in one commit (see the module docstring for the race).
    Returns the changes committed here: none when it already held them."""
    out = shard.evolve_to(target, writer=writer)
    if isinstance(out, Unchanged):
        return []
    if isinstance(out, SchemaConflict):
        raise mismatch(what, out.reason, column=out.column)
    before = sc.history(out.header)[-2]  # the schema the rule planned from
    done = sc.changes_to(sc.entry_schema(before), target)
    assert not isinstance(done, sc.Clash), done
    log.info("evolved %s: %s (schema commit seqno %d) for %s", shard.url, ", ".join(c.describe() for c in done),
             out.header.seqno, what)
    return list(done)
