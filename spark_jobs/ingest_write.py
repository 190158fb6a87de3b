"""spark-submit application of the ingest write step: decode the request, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/ingest_write.py --request JSON [--result-path FILE]

The request is a :class:`shardsink.spark.request.IngestWriteRequest`; the work is
:func:`shardsink.spark.job.write_slot`; exit codes and the outcome record are
:func:`shardsink.spark.entrypoint.run_job`'s. Keep this folder free of modules named
like stdlib ones: Python puts the script's folder first on ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shardsink.spark.entrypoint import run_request
from shardsink.spark.job import write_slot
from shardsink.spark.request import IngestWriteRequest


def main(argv: Sequence[str] | None = None) -> int:
    return run_request(argv, IngestWriteRequest, write_slot, tag="SHARDSINK_WRITE", prog="shardsink-write")


if __name__ == "__main__":
    sys.exit(main())
