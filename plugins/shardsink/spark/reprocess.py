"""Re-processing on Spark: the correction of a sealed range ``[A, B)`` of an ingest source.

    spark-submit --py-files shardsink.zip spark_jobs/ingest_correct.py \\
        --request '<IngestCorrectRequest as JSON>' [--result-path FILE]

(the request: :class:`shardsink.spark.request.IngestCorrectRequest`, whose ``desc.corrects``
is ``[A, B)``; one encoder in the operator, one decoder in the entry point).

This job stages ALL of a correcting description, as slot 0 of 1: the source's ordinary
rows in ``[L, U)`` (as the ingest write job would; the ordinary write tasks skip a
correcting description) and
``correction = source now in [A, B) − shard's holdings for [A, B)`` stamped at ``U - 1``
(:mod:`shardsink.sinks.reprocess`; the arithmetic is the materialize sink's
:func:`shardsink.spark.correction.correction_frame`) as parts recording ``corrects = [A, B)``
(:func:`stage_range_correction`), and publishes its manifest. Exit codes as the other write
jobs (0 staged or already committed, 2 invalid input, 1 otherwise).

The source is re-read for ``[A, B)`` without the late-data check: re-landed files are the
point. The ordinary rows are read with the late-data check, counting ``[A, B)`` as
re-sealed now (this description re-reads it), so a file re-landed for the fix is not late.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from shardsink.core import schema as sch
from shardsink.core.schema import current as current_schema
from shardsink.core.shard import Shard, default_writer
from shardsink.core.state import PartMeta, correction_label
from shardsink.core.updates import DIFF, TIME, user_schema
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import committed
from shardsink.sinks.reprocess import check_range, prior_corrections
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources.base import Seal, Source, source_from_spec
from shardsink.sources.evolution import SchemaMode, read_kwargs
from shardsink.spark import diff_sums as sums
from shardsink.spark import types as sty
from shardsink.spark.correction import correction_frame
from shardsink.spark.read import ShardReads
from shardsink.spark.sample import sample_rows
from shardsink.spark.stage import stage_dataframe

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def range_correction(reads: ShardReads, source: Source, shard: Shard, desc: Description, *,
                     schema: pa.Schema | None = None, schema_mode: SchemaMode = "strict"
                     ) -> tuple[DataFrame, list[Any]]:
    """The correction ``desc`` carries (lazy; stage it inside ``reads``' block) and the inputs read.
    ``schema``: the shard's schema as the caller read it (None: read the head), or a dry run's
    evolved but uncommitted one (the persisted rows then read nulls for its new columns).
    ``schema_mode``: how the source's files are read onto it (:mod:`shardsink.sources.evolution`)."""
    assert desc.corrects is not None
    a, b = desc.corrects
    check_range(shard, a, b)
    schema = shard.schema if schema is None else schema
    spark = reads.spark
    src, inputs = source.read_slot(spark, lower=a, upper=b, slot=0, slots=1, schema=schema, seals=(),
                                   **read_kwargs(schema_mode))
    desired = src.drop(TIME)
    persisted = reads.changes(shard.url, a, b, consolidate=False).drop(TIME)
    prior = prior_corrections(shard, a, b)
    if prior:  # earlier corrections of this range: small, read on the driver
        t = _read_prior(shard, prior, schema).drop_columns([TIME])
        frame = spark.createDataFrame(t.to_pandas(), sty.spark_schema(user_schema(t.schema), time=False, diff=DIFF))
        persisted = persisted.unionByName(frame)
    persisted = _onto(persisted, schema)
    return correction_frame(desired, persisted, schema=schema, upper=desc.upper, where=shard.url), inputs


def _onto(persisted: DataFrame, schema: pa.Schema) -> DataFrame:
    """``persisted`` (user columns + ``_diff``) with ``schema``'s columns and types: itself when it
    has them (``schema`` is the head's); for a dry run's uncommitted evolved schema, its new
    columns as nulls and its widened types cast (what the shard reads once it is evolved)."""
    from pyspark.sql import functions as F

    want = sty.spark_schema(schema, time=False, diff=None).fields
    have = {f.name: f.dataType for f in persisted.schema.fields}
    if all(have.get(f.name) == f.dataType for f in want):
        return persisted
    return persisted.select(*[(sums.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
                              for f in want], sums.col(DIFF))


def _read_prior(shard: Shard, prior: list[PartMeta], schema: pa.Schema) -> pa.Table:
    """The rows of the prior correction parts ``prior``, each read through the schema id its
    batch was written with and projected by field id onto ``schema`` (schema evolution), under
    a read lease (:meth:`shardsink.core.read.ReadHandle.read_batch_parts`).
    SUBTLE: ``prior`` came from an earlier state read; a part no longer in the state (compacted
    meanwhile) is a CorruptionError naming it (re-run the correction)."""
    r = shard.reader()
    v = r.head()
    sid = sch.id_of(v.header, schema)
    return r.read_batch_parts([p.key for p in prior], schema="current" if sid is None else sid, head=v,
                              holder=f"reprocess-prior@{default_writer()}")[1]


def ordinary_rows(spark: SparkSession, source: Source, shard: Shard, desc: Description, *,
                  schema: pa.Schema | None = None, schema_mode: SchemaMode = "strict") -> tuple[DataFrame, list[Any]]:
    """The source's ordinary rows of a correcting description (all slots), late-data checked
    with ``desc.corrects`` counted as re-sealed now. ``schema``: as the caller read it (None: read);
    ``schema_mode``: as for :func:`range_correction`."""
    assert desc.corrects is not None
    sealed = [*seals(shard), Seal(desc.corrects[0], desc.corrects[1], -1, time.time())]
    return source.read_slot(spark, lower=desc.lower, upper=desc.upper, slot=0, slots=1,
                            schema=shard.schema if schema is None else schema, seals=sealed,
                            **read_kwargs(schema_mode))


def stage_correction(spark: SparkSession, source: Source, shard: Shard, desc: Description, *,
                     dry_run: bool = False, sample: int = 0, schema: pa.Schema | None = None,
                     schema_mode: SchemaMode = "strict") -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """Stage (or, ``dry_run``, only encode) a correcting description: its ordinary rows and its
    correction. Returns (parts, inputs, ``sample`` rows of the correction). ``schema``: the
    shard's schema as the caller read it (None: read the head once here); every part is
    written with it, so one schema id labels them all. ``schema_mode``: how the files are read
    onto it; under ``"add_columns"`` the mint evolved the shard first, so a re-landed file's
    new column is in ``schema``, and one that landed after the mint is refused, not dropped."""
    assert desc.corrects is not None
    schema = shard.schema if schema is None else schema
    rows, listing = ordinary_rows(spark, source, shard, desc, schema=schema, schema_mode=schema_mode)
    parts = stage_dataframe(rows, shard_url=shard.url, schema=schema, lower=desc.lower, upper=desc.upper,
                            desc_id=desc.desc_id, dry_run=dry_run)
    with ShardReads(spark, holder=f"reprocess:{desc.desc_id}") as reads:
        corr, inputs = range_correction(reads, source, shard, desc, schema=schema, schema_mode=schema_mode)
        parts += stage_range_correction(corr, shard, desc, schema=schema, dry_run=dry_run)
        got = sample_rows(corr, sample) if sample else []
    return list(parts), [{"ordinary": listing}, {"corrects": list(desc.corrects), "inputs": inputs}], got


def stage_range_correction(corr: DataFrame, shard: Shard, desc: Description, *, schema: pa.Schema,
                           dry_run: bool = False) -> list[PartMeta]:
    """Stage (or, ``dry_run``, only encode) ``corr``, the correction ``desc`` carries, as parts of
    ``desc`` whose records say the range they correct (``PartMeta.corrects = desc.corrects``: what
    re-processing, seals and compaction plans read). They also go under the ``corrects-A_B``
    folder of ``desc``'s prefix (:func:`shardsink.core.state.correction_label`), which older
    shardsinks read instead; nothing here reads it."""
    assert desc.corrects is not None
    parts = stage_dataframe(corr, shard_url=shard.url, schema=schema, lower=desc.lower, upper=desc.upper,
                            desc_id=desc.desc_id, encoding="compact", label=correction_label(*desc.corrects),
                            dry_run=dry_run)
    return [msgspec.structs.replace(p, corrects=desc.corrects) for p in parts]


@dataclass(frozen=True, kw_only=True)
class CorrectionJob:
    """What one correction spark-submit stages: description ``desc`` (which carries
    ``corrects``), whole, as slot ``slot`` of ``slots``, reading files as ``schema_mode`` says."""

    shard_url: str
    source_spec: dict[str, Any]
    desc: Description
    slot: int = 0
    slots: int = 1
    schema_mode: SchemaMode = "strict"


def write_correction(job: CorrectionJob, *,
                     open_session: Callable[[str], AbstractContextManager[SparkSession]]) -> dict[str, object]:
    """Stage the correcting description and publish its manifest; returns a summary.
    ``open_session(name)``: the session it stages in (entered once, stopped on the way out; in
    UTC), a spark-submit application's own or a Spark Connect client session
    (:func:`shardsink.spark.job.write_correction_request`); named ``shardsink-correct-<desc_id>``.
    Nothing is opened if the description already landed."""
    desc = job.desc
    assert desc.corrects is not None
    shard = Shard.open(job.shard_url)
    done = committed(shard, desc)
    if done is not None:
        return {"status": "already_committed", "seqno": done.seqno, "slot": job.slot}
    t0 = time.monotonic()
    header = shard.reader().head().header  # schema and its id from ONE version (the manifest records the id)
    with open_session(f"shardsink-correct-{desc.desc_id}") as spark:
        parts, inputs, _ = stage_correction(spark, source_from_spec(job.source_spec), shard, desc,
                                            schema=header.schema, schema_mode=job.schema_mode)
    doc = write_manifest(shard, desc, slot=job.slot, slots=job.slots, parts=parts, inputs=inputs,
                         schema_id=current_schema(header).id)
    return {"status": "staged", "slot": job.slot, "parts": len(parts), "rows": doc["rows"],
            "bytes": sum(p.bytes for p in parts), "corrects": list(desc.corrects),
            "seconds": round(time.monotonic() - t0, 2)}
