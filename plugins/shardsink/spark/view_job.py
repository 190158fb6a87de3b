"""The materialize sink's write step as a spark-submit application.

    spark-submit --py-files shardsink.zip shardsink/spark/_entry/view_write.py \\
        --shard-url OUTPUT_URL --view JSON --desc-id D --lower L --upper U --attempt K

Stages the correction of one description and publishes its manifest (slot 0 of 1;
:func:`shardsink.spark.view.write_view`). Exit codes: 0 staged (or already committed),
2 invalid input (bad query, schema change, unreadable input frontier), 1 anything else.
Idempotent: a re-run stages fresh parts and replaces the manifest; the append step
deletes the leftovers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardsink-view-write")
    p.add_argument("--shard-url", required=True, help="the view's output shard")
    p.add_argument("--view", required=True, help="view spec as JSON (shardsink.sinks.materialize.View.spec)")
    p.add_argument("--desc-id", required=True)
    p.add_argument("--lower", type=int, required=True)
    p.add_argument("--upper", type=int, required=True)
    p.add_argument("--attempt", type=int, default=1)
    return p.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Stage the view's correction and write its manifest; returns the summary the log shows."""
    from pyspark.sql import SparkSession

    from shardsink.sinks.ingest import Description
    from shardsink.sinks.materialize import View
    from shardsink.spark.view import write_view

    a = _args(argv)
    desc = Description(a.desc_id, a.lower, a.upper, a.attempt)
    v = View.from_spec(json.loads(a.view))
    spark = (SparkSession.builder.appName(f"shardsink-view-{desc.desc_id}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        return write_view(spark, v, output_url=a.shard_url, desc=desc)
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    from shardsink.spark.entrypoint import report

    return report(run, argv, tag="SHARDSINK_VIEW_WRITE")
