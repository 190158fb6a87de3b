"""``ingest_dag(..., schema_mode="add_columns")``: the mint that evolves the shard
(:mod:`shardsink.sources.evolution`). The write operator is the ordinary one
(:class:`shardsink.airflow.reprocess.IngestWriteOperator`, given the mode): its write and
correction requests carry the mode, so both jobs read each file onto the evolved schema.

Where the evolution happens: in the mint task, after it minted something to write and
before any write job starts (a no-op run evolves nothing). So a file that cannot be held
fails the run before anything is written, and every write job, which reads the shard's
head after the mint, stages under a schema that knows all of its columns: no batch commits
rows whose columns the shard does not know. A re-processing run evolves the same way
before its correction job re-reads the range (a re-landed day whose files gained a column).
Racing mints evolve idempotently (:mod:`shardsink.sinks.evolve`). A dry run evolves
nothing: it reports the changes it would make and reads the files onto that uncommitted
schema (:func:`shardsink.spark.dryrun.dry_run_ingest`).
"""

from __future__ import annotations

import logging
from typing import Any

from shardsink.airflow.failures import for_airflow
from shardsink.airflow.run_context import run_writer
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.tasks import mint_task
from shardsink.core.shard import Shard
from shardsink.errors import ShardsinkError
from shardsink.sinks.evolve import evolve_for_source
from shardsink.sources.base import source_from_spec

log = logging.getLogger("shardsink.airflow")


def evolving_mint_task(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`shardsink.airflow.tasks.mint_task` (a dry run reads ``add_columns``-style and ends
    there), then, if it minted descriptions, the shard evolved to hold every file the write
    jobs will read (:func:`shardsink.sinks.evolve.evolve_for_source`). A file that cannot be
    held fails the task at once (not retried), naming the file and the column; nothing is
    written then (the shard's schema included)."""
    out = mint_task(settings, attempt, context, schema_mode="add_columns")  # skips the rest on a no-op / dry run
    if not out:
        return out
    shard = Shard(settings.shard_url)
    try:
        changes = evolve_for_source(shard, source_from_spec(settings.source_spec),
                                    writer=run_writer(context, dag_id=settings.dag_id), desc_id=out[0]["desc_id"])
    except ShardsinkError as e:
        failure = for_airflow(e)
        if failure is e:
            raise
        raise failure from e
    if changes:
        log.info("schema_mode add_columns: evolved %s before writing: %s", shard.url,
                 ", ".join(c.describe() for c in changes))
    return out
