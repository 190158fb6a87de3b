"""spark-submit application of re-processing's correction step: decode the request, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/ingest_correct.py --request JSON [--result-path FILE]

The request is a :class:`shardsink.spark.request.IngestCorrectRequest`; the work is
:func:`shardsink.spark.reprocess.write_correction`; exit codes and the outcome record are
:func:`shardsink.spark.entrypoint.run_job`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shardsink.spark.entrypoint import run_request
from shardsink.spark.job import write_correction_request
from shardsink.spark.request import IngestCorrectRequest


def main(argv: Sequence[str] | None = None) -> int:
    return run_request(argv, IngestCorrectRequest, write_correction_request, tag="SHARDSINK_CORRECT",
                       prog="shardsink-correct")


if __name__ == "__main__":
    sys.exit(main())
