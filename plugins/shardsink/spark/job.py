"""The ingest write step as a library call: stage one slot, publish its manifest.

Submitted as ``spark_jobs/ingest_write.py`` (which parses the arguments)::

    spark-submit --py-files shardsink.zip spark_jobs/ingest_write.py \\
        --shard-url URL --source JSON --desc-id D --lower L --upper U --attempt K --slot I --slots N \\
        [--result-path FILE]

Exit codes and the outcome record: :mod:`shardsink.spark.entrypoint`.

Idempotent per (description, slot): a re-run stages fresh parts and replaces the
manifest; parts of the earlier run are leftovers under the description's prefix that
the append step deletes (see shardsink.sinks.ingest).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from shardsink.sinks.description import Description


@dataclass(frozen=True, kw_only=True)
class IngestWriteJob:
    """One slot of one description: what ``spark_jobs/ingest_write.py`` is asked to write."""

    shard_url: str
    source_spec: dict[str, Any]
    desc: Description
    slot: int
    slots: int


def write_slot(job: IngestWriteJob) -> dict[str, Any]:
    """Stage the slot and write its manifest; returns a summary (what the log line shows).

    Nothing to do (``already_committed``) if the description already landed.
    """
    from pyspark.sql import SparkSession

    from shardsink import hooks
    from shardsink.core.shard import Shard
    from shardsink.errors import InvalidUsageError
    from shardsink.sinks.ingest import committed
    from shardsink.sinks.seals import seals
    from shardsink.sinks.staging import write_manifest
    from shardsink.sources.base import source_from_spec
    from shardsink.spark.stage import stage_dataframe

    if not 0 <= job.slot < job.slots:
        raise InvalidUsageError(f"slot {job.slot} is not in [0, {job.slots})", value=job.slot)
    t0 = time.monotonic()
    desc = job.desc
    shard = Shard.open(job.shard_url)
    done = committed(shard, desc)
    if done is not None:
        return {"status": "already_committed", "seqno": done.seqno, "slot": job.slot}
    source = source_from_spec(job.source_spec)
    schema = shard.schema
    spark = SparkSession.builder.appName(f"shardsink-write-{desc.desc_id}-slot{job.slot}").getOrCreate()
    try:
        df, inputs = source.read_slot(spark, lower=desc.lower, upper=desc.upper, slot=job.slot, slots=job.slots,
                                      schema=schema, seals=seals(shard))
        parts = stage_dataframe(df, shard_url=job.shard_url, schema=schema, lower=desc.lower, upper=desc.upper,
                                desc_id=desc.desc_id)
        hooks.fire("write.staged", shard_url=job.shard_url, slot=job.slot, attempt=desc.attempt, desc_id=desc.desc_id,
                   parts=len(parts))
        doc = write_manifest(shard, desc, slot=job.slot, slots=job.slots, parts=parts, inputs=inputs)
    finally:
        spark.stop()
    return {"status": "staged", "slot": job.slot, "parts": len(parts), "rows": doc["rows"],
            "inputs": len(inputs), "seconds": round(time.monotonic() - t0, 2)}
