"""spark-submit application of re-processing's correction step: parse the arguments, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/ingest_correct.py --shard-url URL --source JSON \\
        --desc-id D --lower L --upper U --attempt K --corrects-from A --corrects-to B [--result-path FILE]

The work is :func:`shardsink.spark.reprocess.write_correction`; exit codes and the outcome
record are :func:`shardsink.spark.entrypoint.run_job`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from shardsink.sinks.description import Description
from shardsink.spark.entrypoint import description_args, run_job
from shardsink.spark.reprocess import CorrectionJob, write_correction


def main(argv: Sequence[str] | None = None) -> int:
    p = description_args(argparse.ArgumentParser(prog="shardsink-correct"))
    p.add_argument("--source", required=True, help="source spec as JSON")
    p.add_argument("--corrects-from", type=int, required=True)
    p.add_argument("--corrects-to", type=int, required=True)
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--slots", type=int, default=1)
    a = p.parse_args(argv)
    desc = Description(a.desc_id, a.lower, a.upper, a.attempt, (a.corrects_from, a.corrects_to))
    job = CorrectionJob(shard_url=a.shard_url, source_spec=json.loads(a.source), desc=desc, slot=a.slot,
                        slots=a.slots)
    return run_job(lambda: write_correction(job), result_path=a.result_path, tag="SHARDSINK_CORRECT")


if __name__ == "__main__":
    sys.exit(main())
