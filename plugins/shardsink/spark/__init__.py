"""Spark side of the sinks: staging DataFrames from executors, the write job, --py-files."""

from shardsink.spark.pyfiles import build_pyfiles_zip

__all__ = ["build_pyfiles_zip", "job_path"]


def job_path() -> str:
    """The spark-submit application of the ingest write step (a file inside the package)."""
    import os

    return os.path.join(os.path.dirname(__file__), "_entry", "ingest_write.py")
