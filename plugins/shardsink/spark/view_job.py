"""The materialize sink's write step as a library call (submitted as ``spark_jobs/view_write.py``
with one typed request, :class:`shardsink.spark.request.ViewWriteRequest`)::

    spark-submit --py-files shardsink.zip spark_jobs/view_write.py --request JSON [--result-path FILE]

or run in an Airflow task process as a Spark Connect client (``SparkOptions(engine="connect")``,
:func:`shardsink.spark.connect.run_over_connect`).

Stages the correction of one description and publishes its manifest (slot 0 of 1;
:func:`shardsink.spark.view.write_view`). Exit codes and the outcome record:
:mod:`shardsink.spark.entrypoint` (invalid input: bad query, schema change, unreadable
input frontier). Idempotent: a re-run stages fresh parts and replaces the manifest;
the append step deletes the leftovers.

HAZARD (Connect): a row-wise view's incremental basis needs the JVM's analysed plan
(:mod:`shardsink.spark.linear`), which a Connect client cannot see, so over Connect every run
compares in full (correct, and its reads grow with the output). The README's engine section says
which engine to pick for a view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsink.spark.request import ViewWriteRequest

if TYPE_CHECKING:
    from shardsink.spark.job import SessionOpener

#: Deprecated alias (the request is the job): use :class:`ViewWriteRequest`.
ViewWriteJob = ViewWriteRequest


def write_view_job(job: ViewWriteRequest, *, open_session: SessionOpener | None = None) -> dict[str, Any]:
    """Stage the view's correction and write its manifest; returns the summary the log shows.
    Works from the output version the write task decided the fate at (``job.decided_at``).
    ``open_session(name)``: the session it runs in, entered once and stopped whatever happens;
    default the spark-submit application's own, in UTC (a view's day boundaries are UTC's)."""
    from shardsink.sinks.materialize import View
    from shardsink.spark.job import utc_submit_session
    from shardsink.spark.view import write_view

    v = View.from_spec(job.view)
    with (open_session or utc_submit_session)(f"shardsink-view-{job.desc.desc_id}") as spark:
        return write_view(spark, v, output_url=job.shard_url, desc=job.desc, decided_at=job.decided_at)
