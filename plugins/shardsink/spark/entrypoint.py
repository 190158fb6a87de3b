"""What every shardsink spark-submit application does around its work: the outcome record,
exit codes and log lines; and where the applications live.

The applications are thin files in the top-level ``spark_jobs/`` folder (they decode their
request, :mod:`shardsink.spark.request`, and call the library through :func:`run_request`);
:func:`job_file` finds them. The library itself ships
to executors with ``--py-files`` (:mod:`shardsink.spark.pyfiles`).

``run_job(body, result_path=..., tag=...)`` runs ``body()`` and returns the exit code:

* success: 0, one ``<tag> {json summary}`` line on stdout and ``JobOutcome(ok=True)``
  at ``result_path``;
* failure: the error class's exit code (2 invalid input, 1 otherwise), one
  ``shardsink: error: <class> (<raised>): <message>`` line on stderr, and
  ``JobOutcome(ok=False, error=ErrorRecord(...))`` at ``result_path``
  (:mod:`shardsink.outcome`). The caller decides from the record, never from the text.

spark-submit puts Spark's ``pyspark.zip`` before the installed pyspark on the driver's path, and
Python caches no bytecode for a zip: the driver would compile pyspark afresh in every job (about
0.55 CPU-s here). :func:`run_request` drops the zip first when an installed pyspark of the zip's
own version is on the path (:func:`shardsink.spark.daemon.prefer_installed_pyspark`).
SUBTLE: that works only while nothing has imported pyspark yet; the applications import the
library's job modules, which import pyspark inside their functions.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardsink.errors import InvalidUsageError
from shardsink.spark.daemon import prefer_installed_pyspark
from shardsink.spark.request import REQUEST_OPTION, R, decode_request


def die_with_parent() -> None:
    """Exit when spark-submit's JVM dies (Airflow's on_kill SIGKILLs only the JVM, which
    would otherwise orphan this driver process). Linux only; a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_job(body: Callable[[], dict[str, Any]], *, result_path: str | None, tag: str) -> int:
    """Run ``body()``; report its summary or its error (module docstring); return the exit code."""
    from shardsink.outcome import CLASSES, JobOutcome, record_of, write_outcome

    die_with_parent()
    try:
        summary = body()
    except Exception as e:
        rec = record_of(e)
        if result_path:
            write_outcome(result_path, JobOutcome(ok=False, error=rec))
        if rec.error_class == "UnexpectedError":
            traceback.print_exc()
        print(f"shardsink: error: {rec.error_class} ({rec.raised}): {rec.message}", file=sys.stderr, flush=True)
        return CLASSES[rec.error_class].exit_code if rec.error_class != "UnexpectedError" else 1
    if result_path:
        write_outcome(result_path, JobOutcome(ok=True, summary=summary))
    print(f"{tag} " + json.dumps(summary, sort_keys=True), flush=True)
    return 0


def run_request(argv: Sequence[str] | None, kind: type[R], body: Callable[[R], dict[str, Any]], *, tag: str,
                prog: str) -> int:
    """An application's whole ``main``: read ``--request`` (a ``kind``, :mod:`shardsink.spark.request`)
    and ``--result-path``, run ``body(request)`` under :func:`run_job`; return the exit code.

    A request that does not decode is reported like any other error: InvalidUsageError
    naming the field, exit 2, and its outcome record.
    """
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument(REQUEST_OPTION, required=True, help="the job request as JSON (shardsink.spark.request)")
    p.add_argument("--result-path", default=None,
                   help="where to write the JobOutcome record (a local file the caller reads afterwards)")
    a = p.parse_args(argv)
    if "pyspark" not in sys.modules:  # module docstring: the installed copy, bytecode cached
        sys.path[:] = prefer_installed_pyspark(sys.path)
    return run_job(lambda: body(decode_request(a.request, kind)), result_path=a.result_path, tag=tag)


def jobs_dir() -> Path:
    """The ``spark_jobs/`` folder: beside the folder holding the ``shardsink`` package
    (``<repo>/plugins/shardsink`` → ``<repo>/spark_jobs``; in the compose images
    ``/opt/airflow/plugins`` → ``/opt/airflow/spark_jobs``)."""
    import shardsink

    return Path(shardsink.__file__).resolve().parents[2] / "spark_jobs"


def job_file(name: str) -> str:
    """Path of the spark-submit application ``spark_jobs/<name>.py``; InvalidUsageError if absent."""
    path = jobs_dir() / f"{name}.py"
    if not path.is_file():
        raise InvalidUsageError(
            f"spark-submit application {path} does not exist; deploy the spark_jobs/ folder beside the "
            "plugins folder, or pass application= to the operator"
        )
    return os.fspath(path)
