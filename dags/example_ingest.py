"""Example persistence pipeline: landing-zone files → one shard, one batch per day.

Settings come from the environment with embedded defaults, so this one file serves
``make run`` (the demo), the tests and docker-compose:

    SHARDSINK_DEMO_ROOT     base folder of the defaults below (default: <repo>/.demo)
    SHARDSINK_LANDING       landing zone (path, file:// or s3:// URL)  [<root>/landing]
    SHARDSINK_SHARD         shard URL                                   [<root>/shards/events]
    SHARDSINK_WRITERS       writer slots (a Spark job or session each)  [2]
    SHARDSINK_ENGINE        submit: each slot a spark-submit; connect: each slot a client session
                            of the Spark Connect server of connection ``spark_connect_default``  [submit]
    SHARDSINK_MAX_SPAN_H    max hours per batch                         [24]
    SHARDSINK_START         first day (ISO date; also the shard's initial upper) [2024-01-01]
    SHARDSINK_MAX_ATTEMPTS  fresh descriptions after lost races         [5]
    SHARDSINK_RETRY_BACKOFF base seconds of the jittered backoff        [2]
    SHARDSINK_TASK_RETRIES / SHARDSINK_TASK_RETRY_DELAY_S               [2 / 30]
    SHARDSINK_AWS_CONN_ID   Airflow ``aws`` connection for S3 stores   [none: the AWS environment]
    SHARDSINK_CATCH_UP_AFTER_S  a run behind an uncovered earlier interval waits this long
                                without shard progress before catching up itself  [300]
    SHARDSINK_POKE_S            how often a waiting run looks again (no slot held)  [15]
    SHARDSINK_ICEBERG       1: keep an Iceberg view of the shard (``make run`` sets it)  [0]

Run params (or run conf): ``dry_run``, ``reprocess_from`` / ``reprocess_to``, ``reprocess``
(see shardsink.airflow.reprocess).
"""

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, ingest_dag
from shardsink.sources import LandingSource

env = os.environ.get
root = Path(env("SHARDSINK_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo")))

dag = ingest_dag(
    dag_id=env("SHARDSINK_DAG_ID", "example_ingest"),
    shard_url=env("SHARDSINK_SHARD", str(root / "shards" / "events")),
    source=LandingSource(env("SHARDSINK_LANDING", str(root / "landing")), time_column="event_time"),
    writers=int(env("SHARDSINK_WRITERS", "2")),
    schedule="@daily",
    start_date=datetime.fromisoformat(env("SHARDSINK_START", "2024-01-01")).replace(tzinfo=UTC),
    shard=ShardOptions(
        max_span=timedelta(hours=float(env("SHARDSINK_MAX_SPAN_H", "24"))),
        aws_conn_id=env("SHARDSINK_AWS_CONN_ID") or None,
        iceberg=env("SHARDSINK_ICEBERG", "0") == "1",
    ),
    attempts=AttemptOptions.from_env(),  # SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, ... (ATTEMPT_ENV)
    spark=SparkOptions(conf={"spark.sql.shuffle.partitions": "2"},
                       engine=env("SHARDSINK_ENGINE", "submit")),  # type: ignore[arg-type]  # checked there
)
