"""The ingest write step as a spark-submit application: stage one slot, publish its manifest.

    spark-submit --py-files shardsink.zip shardsink/spark/_entry/ingest_write.py \\
        --shard-url URL --source JSON --desc-id D --lower L --upper U --attempt K --slot I --slots N

Exit codes: 0 staged (or the description is already committed: nothing to do),
2 invalid input (malformed or late source data, bad arguments), 1 anything else.

Idempotent per (description, slot): a re-run stages fresh parts and replaces the
manifest; parts of the earlier run are leftovers under the description's prefix that
the append step deletes (see shardsink.sinks.ingest).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardsink-write")
    p.add_argument("--shard-url", required=True)
    p.add_argument("--source", required=True, help="source spec as JSON")
    p.add_argument("--desc-id", required=True)
    p.add_argument("--lower", type=int, required=True)
    p.add_argument("--upper", type=int, required=True)
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    return p.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Stage the slot and write its manifest; returns a summary (what the log line shows)."""
    from pyspark.sql import SparkSession

    from shardsink.core.shard import Shard
    from shardsink.errors import InvalidUsageError
    from shardsink.sinks import faults
    from shardsink.sinks.ingest import Description, committed, seals, write_manifest
    from shardsink.sources.base import source_from_spec
    from shardsink.spark.stage import stage_dataframe

    a = _args(argv)
    if not 0 <= a.slot < a.slots:
        raise InvalidUsageError(f"slot {a.slot} is not in [0, {a.slots})")
    t0 = time.monotonic()
    desc = Description(a.desc_id, a.lower, a.upper, a.attempt)
    shard = Shard.open(a.shard_url)
    done = committed(shard, desc)
    if done is not None:
        return {"status": "already_committed", "seqno": done.seqno, "slot": a.slot}
    source = source_from_spec(json.loads(a.source))
    schema = shard.schema
    spark = SparkSession.builder.appName(f"shardsink-write-{desc.desc_id}-slot{a.slot}").getOrCreate()
    try:
        df, inputs = source.read_slot(spark, lower=desc.lower, upper=desc.upper, slot=a.slot, slots=a.slots,
                                      schema=schema, seals=seals(shard))
        parts = stage_dataframe(df, shard_url=a.shard_url, schema=schema, lower=desc.lower, upper=desc.upper,
                                desc_id=desc.desc_id)
        if faults.fire("write_kill", slot=a.slot, attempt=desc.attempt):
            print(f"SHARDSINK_FAULT write_kill: killing slot {a.slot} after staging {len(parts)} parts", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        doc = write_manifest(shard, desc, slot=a.slot, slots=a.slots, parts=parts, inputs=inputs)
    finally:
        spark.stop()
    return {"status": "staged", "slot": a.slot, "parts": len(parts), "rows": doc["rows"],
            "inputs": len(inputs), "seconds": round(time.monotonic() - t0, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the write step; exit codes and log lines as in :mod:`shardsink.spark.entrypoint`."""
    from shardsink.spark.entrypoint import report

    return report(run, argv, tag="SHARDSINK_WRITE")


if __name__ == "__main__":
    sys.exit(main())
