"""The materialize sink's write step as a library call (submitted as ``spark_jobs/view_write.py``)::

    spark-submit --py-files shardsink.zip spark_jobs/view_write.py \\
        --shard-url OUTPUT_URL --view JSON --desc-id D --lower L --upper U --attempt K [--result-path FILE]

Stages the correction of one description and publishes its manifest (slot 0 of 1;
:func:`shardsink.spark.view.write_view`). Exit codes and the outcome record:
:mod:`shardsink.spark.entrypoint` (invalid input: bad query, schema change, unreadable
input frontier). Idempotent: a re-run stages fresh parts and replaces the manifest;
the append step deletes the leftovers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardsink.sinks.description import Description


@dataclass(frozen=True, kw_only=True)
class ViewWriteJob:
    """One description of a view: what ``spark_jobs/view_write.py`` is asked to write."""

    shard_url: str
    view_spec: dict[str, Any]
    desc: Description


def write_view_job(job: ViewWriteJob) -> dict[str, Any]:
    """Stage the view's correction and write its manifest; returns the summary the log shows."""
    from pyspark.sql import SparkSession

    from shardsink.sinks.materialize import View
    from shardsink.spark.view import write_view

    v = View.from_spec(job.view_spec)
    spark = (SparkSession.builder.appName(f"shardsink-view-{job.desc.desc_id}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        return write_view(spark, v, output_url=job.shard_url, desc=job.desc)
    finally:
        spark.stop()
