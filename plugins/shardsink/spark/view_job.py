"""The materialize sink's write step as a library call (submitted as ``spark_jobs/view_write.py``
with one typed request, :class:`shardsink.spark.request.ViewWriteRequest`)::

    spark-submit --py-files shardsink.zip spark_jobs/view_write.py --request JSON [--result-path FILE]

Stages the correction of one description and publishes its manifest (slot 0 of 1;
:func:`shardsink.spark.view.write_view`). Exit codes and the outcome record:
:mod:`shardsink.spark.entrypoint` (invalid input: bad query, schema change, unreadable
input frontier). Idempotent: a re-run stages fresh parts and replaces the manifest;
the append step deletes the leftovers.
"""

from __future__ import annotations

from typing import Any

from shardsink.spark.request import ViewWriteRequest

#: Deprecated alias (the request is the job): use :class:`ViewWriteRequest`.
ViewWriteJob = ViewWriteRequest


def write_view_job(job: ViewWriteRequest) -> dict[str, Any]:
    """Stage the view's correction and write its manifest; returns the summary the log shows.
    Works from the output version the write task decided the fate at (``job.decided_at``)."""
    from pyspark.sql import SparkSession

    from shardsink.sinks.materialize import View
    from shardsink.spark.view import write_view

    v = View.from_spec(job.view)
    spark = (SparkSession.builder.appName(f"shardsink-view-{job.desc.desc_id}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        return write_view(spark, v, output_url=job.shard_url, desc=job.desc, decided_at=job.decided_at)
    finally:
        spark.stop()
