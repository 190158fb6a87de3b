"""``ingest_dag(..., schema_mode="add_columns")``: the mint that evolves the shard and the write
operator that reads files onto the evolved schema (:mod:`shardsink.sources.evolution`).

Where the evolution happens: in the mint task, after it minted something to write and
before any write job starts (a no-op run or a dry run evolves nothing). So a file that
cannot be held fails the run before anything is written, and every write job, which reads
the shard's head after the mint, stages under a schema that knows all of its columns: no
batch commits rows whose columns the shard does not know. Racing mints evolve
idempotently (:mod:`shardsink.sinks.evolve`).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from shardsink.airflow.failures import for_airflow
from shardsink.airflow.reprocess import IngestWriteOperator
from shardsink.airflow.run_context import run_writer
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.tasks import mint_task
from shardsink.core.shard import Shard
from shardsink.errors import ShardsinkError
from shardsink.sinks.description import Description
from shardsink.sinks.evolve import evolve_for_source
from shardsink.sources.base import source_from_spec
from shardsink.sources.evolution import SchemaMode
from shardsink.spark.request import IngestWriteRequest, JobRequest

log = logging.getLogger("shardsink.airflow")


def evolving_mint_task(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`shardsink.airflow.tasks.mint_task`, then, if it minted descriptions, the shard evolved
    to hold every file the write jobs will read (:func:`shardsink.sinks.evolve.evolve_for_source`).
    A file that cannot be held fails the task at once (not retried), naming the file and the
    column; nothing is written then (the shard's schema included)."""
    out = mint_task(settings, attempt, context)  # skips the rest on a no-op and ends a dry run
    if not out:
        return out
    shard = Shard(settings.shard_url)
    try:
        changes = evolve_for_source(shard, source_from_spec(settings.source_spec),
                                    writer=run_writer(context, dag_id=settings.dag_id))
    except ShardsinkError as e:
        failure = for_airflow(e)
        if failure is e:
            raise
        raise failure from e
    if changes:
        log.info("schema_mode add_columns: evolved %s before writing: %s", shard.url,
                 ", ".join(c.describe() for c in changes))
    return out


class EvolvingWriteOperator(IngestWriteOperator):
    """The ingest write operator of a DAG with ``schema_mode`` other than ``"strict"``: its
    requests carry the mode, so the write job reads each file onto the shard's schema (columns
    the file lacks as nulls). Corrections (re-processing) keep the strict read."""

    def __init__(self, *, schema_mode: SchemaMode = "add_columns", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schema_mode: SchemaMode = schema_mode

    def job_request(self, d: Description) -> JobRequest:
        req = super().job_request(d)
        return msgspec.structs.replace(req, schema_mode=self.schema_mode) if isinstance(req, IngestWriteRequest) \
            else req
