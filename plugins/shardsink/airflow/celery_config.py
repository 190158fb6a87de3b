"""Celery configuration for Airflow workers that run shardsink tasks: preload shardsink.

Point Airflow at it on every Celery worker (docker-compose.yaml does)::

    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=shardsink.airflow.celery_config.CELERY_CONFIG

It is Airflow's default Celery configuration plus Celery's ``imports``: the worker's main
process imports :data:`PRELOAD` once at start, before it forks its pool. Airflow 3 runs each
task in a process forked from a pool process, and that process parses the task's DAG file:
without the preload, every task imports shardsink, pyarrow and boto3 again (about 0.7 s of
CPU per task here; a 10-day backfill with a view runs some 90 tasks), and a Connect write task
pyspark's Connect client (about 1.6 s more).

Reading this configuration imports ``shardsink.airflow`` already (this module is in it), and
today that package imports the rest; ``imports`` names what tasks use anyway, so the preload
holds if the package's own imports become lazier.

SUBTLE: an import error here stops the worker at start, naming the module: better than every
task failing later on the same error. Nothing here starts a thread or opens a connection, so
the forked pool and task processes inherit no live state.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

#: The Spark Connect client a write, view or dry-run task of an ``engine="connect"`` DAG opens its
#: session with (gRPC, protobuf, pyspark's Connect modules: about 1.6 CPU-s in each such task
#: otherwise). Preloaded where pyspark's Connect client is installed. Importing it starts no thread
#: and opens no channel: the forked tasks open their own.
CONNECT_CLIENT: tuple[str, ...] = (
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.functions",
    "airflow.providers.apache.spark.hooks.spark_connect",
    "shardsink.airflow.connect_write",
    "shardsink.spark.connect",
)

#: What a shardsink task process would otherwise import first: the DAG factories (the DAG file),
#: the operators' runtime (state, store, Parquet), the AWS client library and, if installed,
#: the Spark Connect client.
PRELOAD: tuple[str, ...] = (
    "shardsink.airflow",
    "shardsink.sinks.materialize",
    "shardsink.sources",
    "boto3",
    "pyarrow.parquet",
    *(CONNECT_CLIENT if find_spec("pyspark") is not None and find_spec("grpc") is not None else ()),
)

CELERY_CONFIG: dict[str, Any] = {**DEFAULT_CELERY_CONFIG, "imports": PRELOAD}
