"""A PySpark worker daemon that imports what shardsink's executor code needs once, before it forks.

Set on a Spark Connect server: ``--conf spark.python.daemon.module=shardsink.spark.daemon``.
A Connect server starts one Python worker daemon per client session (each session's jobs run
with their own ``SPARK_JOB_ARTIFACT_UUID``, so sessions never share a daemon), and every worker
the daemon forks for a session's tasks would import pyarrow, the worker's own modules and
shardsink afresh. Imported here, in the daemon, they are paid once per session and shared
copy-on-write by the forked workers. Changes nothing a worker computes.
"""

from __future__ import annotations


def _preload() -> None:
    """Import the executors' modules; a module that fails to import is left to the worker (which
    then reports it as it would without this daemon)."""
    import importlib

    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute", "pyspark.worker", "pyspark.sql.pandas.serializers",
                 "shardsink.spark.stage", "shardsink.spark.connect", "shardsink.sources.landing.read",
                 "shardsink.outcome"):
        try:
            importlib.import_module(name)
        except Exception:
            continue


if __name__ == "__main__":
    from pyspark.daemon import manager

    _preload()
    manager()
