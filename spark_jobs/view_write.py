"""spark-submit application of the materialize sink's write step: parse the arguments, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/view_write.py --shard-url OUTPUT_URL --view JSON \\
        --desc-id D --lower L --upper U --attempt K [--result-path FILE]

The work is :func:`shardsink.spark.view_job.write_view_job`; exit codes and the outcome
record are :func:`shardsink.spark.entrypoint.run_job`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from shardsink.sinks.description import Description
from shardsink.spark.entrypoint import description_args, run_job
from shardsink.spark.view_job import ViewWriteJob, write_view_job


def main(argv: Sequence[str] | None = None) -> int:
    p = description_args(argparse.ArgumentParser(prog="shardsink-view-write"))
    p.add_argument("--view", required=True, help="view spec as JSON (shardsink.sinks.materialize.View.spec)")
    a = p.parse_args(argv)
    job = ViewWriteJob(shard_url=a.shard_url, view_spec=json.loads(a.view),
                       desc=Description(a.desc_id, a.lower, a.upper, a.attempt))
    return run_job(lambda: write_view_job(job), result_path=a.result_path, tag="SHARDSINK_VIEW_WRITE")


if __name__ == "__main__":
    sys.exit(main())
