"""spark-submit application of the ingest write step: parse the arguments, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/ingest_write.py --shard-url URL --source JSON \\
        --desc-id D --lower L --upper U --attempt K --slot I --slots N [--result-path FILE]

The work is :func:`shardsink.spark.job.write_slot`; exit codes and the outcome record
are :func:`shardsink.spark.entrypoint.run_job`'s. Keep this folder free of modules named
like stdlib ones: Python puts the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from shardsink.sinks.description import Description
from shardsink.spark.entrypoint import description_args, run_job
from shardsink.spark.job import IngestWriteJob, write_slot


def main(argv: Sequence[str] | None = None) -> int:
    p = description_args(argparse.ArgumentParser(prog="shardsink-write"))
    p.add_argument("--source", required=True, help="source spec as JSON")
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    a = p.parse_args(argv)
    job = IngestWriteJob(shard_url=a.shard_url, source_spec=json.loads(a.source), slot=a.slot, slots=a.slots,
                         desc=Description(a.desc_id, a.lower, a.upper, a.attempt))
    return run_job(lambda: write_slot(job), result_path=a.result_path, tag="SHARDSINK_WRITE")


if __name__ == "__main__":
    sys.exit(main())
