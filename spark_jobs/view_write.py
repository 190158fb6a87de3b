"""spark-submit application of the materialize sink's write step: decode the request, call the library.

    spark-submit --py-files shardsink.zip spark_jobs/view_write.py --request JSON [--result-path FILE]

The request is a :class:`shardsink.spark.request.ViewWriteRequest`; the work is
:func:`shardsink.spark.view_job.write_view_job`; exit codes and the outcome record are
:func:`shardsink.spark.entrypoint.run_job`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shardsink.spark.entrypoint import run_request
from shardsink.spark.request import ViewWriteRequest
from shardsink.spark.view_job import write_view_job


def main(argv: Sequence[str] | None = None) -> int:
    return run_request(argv, ViewWriteRequest, write_view_job, tag="SHARDSINK_VIEW_WRITE", prog="shardsink-view-write")


if __name__ == "__main__":
    sys.exit(main())
