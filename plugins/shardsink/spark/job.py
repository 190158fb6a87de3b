"""The ingest write steps as library calls: stage one slot, publish its manifest; and the
correction of a re-processing description.

Submitted as ``spark_jobs/ingest_write.py`` / ``spark_jobs/ingest_correct.py``, each with one
typed request (:mod:`shardsink.spark.request`)::

    spark-submit --py-files shardsink.zip spark_jobs/ingest_write.py --request JSON [--result-path FILE]

Exit codes and the outcome record: :mod:`shardsink.spark.entrypoint`.

Idempotent per (description, slot): a re-run stages fresh parts and replaces the
manifest; parts of the earlier run are leftovers under the description's prefix that
the append step deletes (see shardsink.sinks.ingest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from shardsink.spark.request import IngestCorrectRequest, IngestWriteRequest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from shardsink.core.fate import Committed
    from shardsink.core.shard import Shard
    from shardsink.core.state import Version

#: Opens the Spark session a job works in, given its name; entered once, stopped on the way out.
SessionOpener = Callable[[str], AbstractContextManager["SparkSession"]]

#: Deprecated alias (the request is the job): use :class:`IngestWriteRequest`.
IngestWriteJob = IngestWriteRequest


def submit_session(name: str, *, timezone: str | None = None) -> AbstractContextManager[SparkSession]:
    """The spark-submit engine's session: the application's own (``getOrCreate``), stopped after.
    ``timezone``: its ``spark.sql.session.timeZone`` (None: Spark's default)."""
    from pyspark.sql import SparkSession

    @contextmanager
    def session() -> Iterator[SparkSession]:
        builder = SparkSession.builder.appName(name)
        spark = (builder if timezone is None else builder.config("spark.sql.session.timeZone", timezone)).getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()

    return session()


def utc_submit_session(name: str) -> AbstractContextManager[SparkSession]:
    """:func:`submit_session` in UTC (the correction job's: its arithmetic runs on event times)."""
    return submit_session(name, timezone="UTC")


def write_slot(job: IngestWriteRequest, *, open_session: SessionOpener | None = None) -> dict[str, Any]:
    """Stage the slot and write its manifest; returns a summary (what the log line shows).

    Nothing to do (``already_committed``) if the description already landed (no session is
    opened). ``open_session(name)``: the Spark session the slot stages with, entered once and
    left (stopped) whatever happens; default :func:`submit_session` (spark-submit), the Connect
    engine passes one of :func:`shardsink.spark.connect.connect_session`. The name is
    ``shardsink-write-<desc_id>-slot<n>``.
    """
    from shardsink import hooks
    from shardsink.core.schema import current as current_schema
    from shardsink.core.shard import Shard
    from shardsink.errors import InvalidUsageError
    from shardsink.sinks.seals import seals
    from shardsink.sinks.staging import write_manifest
    from shardsink.sources.base import source_from_spec
    from shardsink.spark.stage import stage_dataframe

    if not 0 <= job.slot < job.slots:
        raise InvalidUsageError(f"slot {job.slot} is not in [0, {job.slots})", value=job.slot)
    t0 = time.monotonic()
    desc = job.desc
    shard = Shard(job.shard_url)
    head, done = slot_facts(shard, job)
    if done is not None:
        return {"status": "already_committed", "seqno": done.seqno, "slot": job.slot}
    source = source_from_spec(job.source)
    # SUBTLE: schema and schema id from the SAME version: the manifest records the id the parts
    # are written with, so a schema change before the append does not relabel them.
    schema, schema_id = head.header.schema, current_schema(head.header).id
    # add_columns: the mint evolved the shard before this job read its head; files are read onto it.
    mode: dict[str, Any] = {} if job.schema_mode == "strict" else {"schema_mode": job.schema_mode}
    opener = open_session or submit_session
    with opener(f"shardsink-write-{desc.desc_id}-slot{job.slot}") as spark:
        # A source that plans its reads at mint (the landing zone) reads the description's plan.
        planned: dict[str, Any] = {"shard_url": job.shard_url, "desc_id": desc.desc_id,
                                   "listed": desc.listing is not None} if hasattr(source, "prepare_chain") else {}
        df, inputs = source.read_slot(spark, lower=desc.lower, upper=desc.upper, slot=job.slot, slots=job.slots,
                                      schema=schema, seals=seals(shard, head=head), **mode, **planned)
        parts = stage_dataframe(df, shard_url=job.shard_url, schema=schema, lower=desc.lower, upper=desc.upper,
                                desc_id=desc.desc_id, order=job.part_order, at=head)
        hooks.fire("write.staged", shard_url=job.shard_url, slot=job.slot, attempt=desc.attempt, desc_id=desc.desc_id,
                   parts=len(parts))
        doc = write_manifest(shard, desc, slot=job.slot, slots=job.slots, parts=parts, inputs=inputs,
                             schema_id=schema_id)
    return {"status": "staged", "slot": job.slot, "parts": len(parts), "rows": doc["rows"],
            "inputs": len(inputs), "order": job.part_order, "seconds": round(time.monotonic() - t0, 2)}


def slot_facts(shard: Shard, job: IngestWriteRequest) -> tuple[Version, Committed | None]:
    """The state version a write slot works from, and the commit of its description if it landed.

    The write task reads the head once: when the operator already decided the fate at
    ``job.decided_at``, that immutable version is fetched (no head read, no second decision;
    see :class:`~shardsink.spark.request.IngestWriteRequest` for why a version seconds old is
    safe); else (no decision passed, or that version was collected meanwhile) the head is
    read once and the fate decided from it.
    """
    from shardsink.sinks.ingest import committed

    head = shard.reader().version(job.decided_at) if job.decided_at is not None else None
    if head is not None:
        return head, None
    head = shard.reader().head()
    return head, committed(shard, job.desc, head=head)


def write_correction_request(req: IngestCorrectRequest, *, open_session: SessionOpener | None = None
                             ) -> dict[str, object]:
    """Stage a correcting description whole (:func:`shardsink.spark.reprocess.write_correction`).
    ``open_session``: as for :func:`write_slot` (default: the spark-submit application's own, in UTC)."""
    from shardsink.spark.reprocess import CorrectionJob, write_correction
    from shardsink.specs import spec_to_builtins

    return write_correction(CorrectionJob(shard_url=req.shard_url, source_spec=spec_to_builtins(req.source),
                                          desc=req.desc, slot=req.slot, slots=req.slots,
                                          schema_mode=req.schema_mode),
                            open_session=open_session or utc_submit_session)
