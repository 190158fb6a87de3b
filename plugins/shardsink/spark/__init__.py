"""Spark side of the sinks: staging DataFrames from executors, the write jobs, --py-files."""

from shardsink.spark.pyfiles import build_pyfiles_zip

__all__ = ["build_pyfiles_zip", "job_path", "view_job_path"]


def job_path() -> str:
    """The spark-submit application of the ingest write step (``spark_jobs/ingest_write.py``)."""
    from shardsink.spark.entrypoint import job_file

    return job_file("ingest_write")


def view_job_path() -> str:
    """The spark-submit application of the view write step (``spark_jobs/view_write.py``)."""
    from shardsink.spark.entrypoint import job_file

    return job_file("view_write")
