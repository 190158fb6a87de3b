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

Runs on a local Spark session inside the Airflow task (``local[2]``): a dry run is an
inspection, not a production write, so it does not go through spark-submit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardsink.core.shard import Shard
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF
from shardsink.sinks.description import Description
from shardsink.sinks.seals import seals
from shardsink.sources.base import Source
from shardsink.spark.sample import sample_rows
from shardsink.spark.stage import stage_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shardsink.sinks.materialize import View


def local_session(app: str) -> SparkSession:
    """A local Spark session for the dry run (the task's own interpreter on the workers)."""
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.master("local[2]").appName(app).config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate())


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


def dry_run_ingest(spark: SparkSession, source: Source, shard: Shard, descs: Sequence[Description], *,
                   slots: int, sample: int = 5) -> list[dict[str, Any]]:
    """What each description of an ingest (or re-processing) run would write; writes nothing."""
    from shardsink.sinks.reprocess import correction_label
    from shardsink.spark.read import ShardReads
    from shardsink.spark.reprocess import ordinary_rows, range_correction

    out = []
    sealed = seals(shard)
    for d in descs:
        parts: list[PartMeta] = []
        rows: list[dict[str, Any]] = []
        frames = [ordinary_rows(spark, source, shard, d)[0]] if d.corrects is not None else [
            source.read_slot(spark, lower=d.lower, upper=d.upper, slot=slot, slots=slots, schema=shard.schema,
                             seals=sealed)[0] for slot in range(slots)]
        for df in frames:
            parts += stage_dataframe(df, shard_url=shard.url, schema=shard.schema, lower=d.lower, upper=d.upper,
                                     desc_id=d.desc_id, dry_run=True)
            if len(rows) < sample:
                rows += sample_rows(df, sample - len(rows))
        out.append(summary(d, parts, what="ingest", sample=rows))
        if d.corrects is not None:
            with ShardReads(spark, holder=f"dry-run:{d.desc_id}") as reads:
                corr, _ = range_correction(reads, source, shard, d)
                cparts = stage_dataframe(corr, shard_url=shard.url, schema=shard.schema, lower=d.lower,
                                         upper=d.upper, desc_id=d.desc_id, encoding="compact",
                                         label=correction_label(*d.corrects), dry_run=True)
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
    """The report's headline: updates and bytes over every line."""
    return {"updates": sum(x["updates"] for x in lines), "bytes": sum(x["bytes"] for x in lines),
            "descriptions": len({x["desc_id"] for x in lines}), "lines": list(lines)}


def log_line(report: dict[str, Any]) -> str:
    return "DRY RUN (nothing written): " + json.dumps(report, sort_keys=True, default=str)
