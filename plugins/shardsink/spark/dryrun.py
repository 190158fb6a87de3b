"""Read-only (dry-run) runs: what a run WOULD write, computed exactly, with nothing written.

Seed 002's read-only mode. The description(s) are minted as usual (a state read); the
rows are computed by the same code as the real write (source slots, view correction,
re-processing correction) and encoded into parts by the same staging function with
``dry_run=True``, which uploads nothing. The report: per description its bounds, rows
(inserts / retractions), bytes of the parts it would write, and a small sample of the
rows (the correction for views and re-processing). No parts, no manifests, no state:
the store is byte-identical afterwards. (Like every Spark read of a shard, a dry run that
reads a shard holds a read lease under ``leases/`` while it reads; the lease object is
deleted when the read ends.)

Under ``schema_mode="add_columns"`` the real run's mint would evolve the shard first; a dry
run commits no schema either: it computes the schema the evolution would make (the same
:func:`shardsink.sources.evolution.target_schema` over the same files), reports its changes
(a ``"schema"`` line, and ``schema_changes`` in the headline: ``"would add column country:
string"``) and reads the files onto that uncommitted schema. A file that cannot be held
fails the dry run with the error the real run would raise.

Runs on a local Spark session inside the Airflow task (``local[2]``): a dry run is an
inspection, not a production write, so it does not go through spark-submit. A DAG whose jobs run
over Spark Connect (``SparkOptions(engine="connect")``) dry-runs as a session of its server
instead: no JVM in the task (:func:`dry_run_session`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF
from shardsink.sinks.description import Description
from shardsink.sinks.seals import seals
from shardsink.sources.base import Source
from shardsink.sources.evolution import (
    SchemaMode,
    changes_to,
    check_schema_mode,
    read_kwargs,
    run_file_schemas,
    target_schema,
)
from shardsink.spark.sample import sample_rows
from shardsink.spark.stage import stage_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shardsink.sinks.materialize import View


@contextmanager
def dry_run_session(app: str, *, connect: str | None = None) -> Iterator[SparkSession]:
    """The dry run's Spark session, in UTC, stopped on the way out: a session of the Spark Connect
    server at ``connect`` (``sc://...``; :func:`shardsink.spark.connect.connect_session`), or
    (None) a local one in this process (the task's own interpreter on the workers)."""
    import os

    from pyspark.sql import SparkSession

    if connect is not None:
        from shardsink.spark.connect import connect_session

        with connect_session(connect, name=app, timezone="UTC", check="python") as remote:
            yield remote
        return
    from shardsink.spark.daemon import daemon_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf: dict[str, Any] = daemon_conf({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                        "spark.sql.session.timeZone": "UTC"}, master="local[2]",
                       worker_python=os.environ["PYSPARK_PYTHON"])
    spark = SparkSession.builder.master("local[2]").appName(app).config(map=conf).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


def summary(desc: Description, parts: Sequence[PartMeta], *, what: str, sample: list[dict[str, Any]],
            signs: tuple[int, int] | None = None) -> dict[str, Any]:
    """One description's dry-run line: bounds, rows, bytes, sample (JSON-able)."""
    out: dict[str, Any] = {"what": what, "desc_id": desc.desc_id, "lower": desc.lower, "upper": desc.upper,
                           "updates": sum(p.rows for p in parts), "bytes": sum(p.bytes for p in parts),
                           "parts": len(parts), "sample": sample}
    if signs is not None:
        out["inserts"], out["retractions"] = signs
    if desc.corrects is not None:
        out["corrects"] = list(desc.corrects)
    return out


def _signs(df: DataFrame) -> tuple[int, int]:
    from pyspark.sql import functions as F

    r = df.agg(F.sum(F.when(F.col(DIFF) > 0, F.col(DIFF)).otherwise(0)).alias("i"),
               F.sum(F.when(F.col(DIFF) < 0, -F.col(DIFF)).otherwise(0)).alias("r")).collect()[0]
    return int(r["i"] or 0), int(r["r"] or 0)


def would_evolve(shard: Shard, source: Source, schema: pa.Schema) -> tuple[pa.Schema, list[SchemaChange]]:
    """The schema ``schema_mode="add_columns"``'s mint would evolve ``shard`` (whose schema is
    ``schema``) to, and the changes it would commit; nothing is committed. The same files
    (:func:`shardsink.sources.evolution.run_file_schemas`) and the same plan as the real mint's
    (:func:`shardsink.sinks.evolve.evolve_for_source`), so the same SchemaMismatchError /
    MalformedInputError naming the file and column."""
    target = target_schema(schema, run_file_schemas(source, schema, shard_url=shard.url))
    return target, changes_to(schema, target, what=f"the files of {getattr(source, 'kind', 'the')} source")


def _schema_line(d: Description, changes: Sequence[SchemaChange]) -> dict[str, Any]:
    """The dry run's report of the schema changes the run would commit before writing ``d``."""
    would = [f"would {c.kind} column {c.name}: {c.type}" for c in changes]
    return {**summary(d, [], what="schema", sample=[]), "schema_changes": would}


def dry_run_ingest(spark: SparkSession, source: Source, shard: Shard, descs: Sequence[Description], *,
                   slots: int, sample: int = 5, schema_mode: SchemaMode = "strict") -> list[dict[str, Any]]:
    """What each description of an ingest (or re-processing) run would write; writes nothing.
    ``schema_mode="add_columns"``: first the schema changes the run would commit (a ``"schema"``
    line before the first description's, if any), then every read onto that uncommitted schema."""
    from shardsink.spark.read import ShardReads
    from shardsink.spark.reprocess import ordinary_rows, range_correction, stage_range_correction

    out = []
    head = shard.reader().head()  # one read: the schema and the seals from the same version
    schema, sealed, mode = head.header.schema, seals(shard, head=head), check_schema_mode(schema_mode)
    if mode == "add_columns" and descs:
        schema, changes = would_evolve(shard, source, schema)
        if changes:
            out.append(_schema_line(descs[0], changes))
    for d in descs:
        parts: list[PartMeta] = []
        rows: list[dict[str, Any]] = []
        frames = [ordinary_rows(spark, source, shard, d, schema=schema, schema_mode=mode)[0]] \
            if d.corrects is not None else [
            source.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots, schema=schema,
                             seals=sealed, **read_kwargs(mode))[0] for slot in range(slots)]
        for df in frames:
            parts += stage_dataframe(df, shard_url=shard.url, schema=schema, lower=d.lower, upper=d.upper,
                                     desc_id=d.desc_id, dry_run=True)
            if len(rows) < sample:
                rows += sample_rows(df, sample - len(rows))
        out.append(summary(d, parts, what="ingest", sample=rows))
        if d.corrects is not None:
            with ShardReads(spark, holder=f"dry-run:{d.desc_id}") as reads:
                corr, _ = range_correction(reads, source, shard, d, schema=schema, schema_mode=mode)
                cparts = stage_range_correction(corr, shard, d, schema=schema, dry_run=True)
                out.append(summary(d, cparts, what="correction", sample=sample_rows(corr, sample),
                                   signs=_signs(corr)))
    return out


def dry_run_view(spark: SparkSession, v: View, *, output_url: str, desc: Description,
                 sample: int = 5) -> dict[str, Any]:
    """What a view run would write (its correction); creates and writes nothing."""
    from shardsink.spark.read import ShardReads
    from shardsink.spark.view import correct_view

    with ShardReads(spark, holder=f"dry-run:{desc.desc_id}") as reads:
        c = correct_view(reads, v, output_url=output_url, desc=desc)
        parts = stage_dataframe(c.frame, shard_url=output_url, schema=c.schema, lower=desc.lower, upper=desc.upper,
                                desc_id=desc.desc_id, encoding="compact", dry_run=True)
        return summary(desc, parts, what="view correction", sample=sample_rows(c.frame, sample),
                       signs=_signs(c.frame))


def totals(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The report's headline: updates and bytes over every line, and the schema changes the run
    would commit (``schema_changes``, only when there are some)."""
    out = {"updates": sum(x["updates"] for x in lines), "bytes": sum(x["bytes"] for x in lines),
           "descriptions": len({x["desc_id"] for x in lines}), "lines": list(lines)}
    changes = [c for x in lines for c in x.get("schema_changes", ())]
    return {**out, "schema_changes": changes} if changes else out


def log_line(report: dict[str, Any]) -> str:
    return "DRY RUN (nothing written): " + json.dumps(report, sort_keys=True, default=str)
