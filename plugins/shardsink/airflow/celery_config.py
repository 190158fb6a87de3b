"""Celery configuration for Airflow workers that run shardsink tasks: preload shardsink.

Point Airflow at it on every Celery worker (docker-compose.yaml does)::

    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=shardsink.airflow.celery_config.CELERY_CONFIG

It is Airflow's default Celery configuration plus Celery's ``imports``: the worker's main
process imports :data:`PRELOAD` once at start, before it forks its pool. Airflow 3 runs each
task in a process forked from a pool process, and that process parses the task's DAG file:
without the preload, every task imports shardsink, pyarrow and boto3 again (about 0.7 s of
CPU per task here; a 10-day backfill with a view runs some 90 tasks).

Reading this configuration imports ``shardsink.airflow`` already (this module is in it), and
today that package imports the rest; ``imports`` names what tasks use anyway, so the preload
holds if the package's own imports become lazier.

SUBTLE: an import error here stops the worker at start, naming the module: better than every
task failing later on the same error. Nothing here starts a thread or opens a connection, so
the forked pool and task processes inherit no live state.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

#: What a shardsink task process would otherwise import first: the DAG factories (the DAG file),
#: the operators' runtime (state, store, Parquet) and the AWS client library.
PRELOAD: tuple[str, ...] = (
    "shardsink.airflow",
    "shardsink.sinks.materialize",
    "shardsink.sources",
    "boto3",
    "pyarrow.parquet",
)

CELERY_CONFIG: dict[str, Any] = {**DEFAULT_CELERY_CONFIG, "imports": PRELOAD}
