"""Example self-correcting view: events per user per day over the example ingest shard.

Runs whenever the ingest DAG commits a batch (the shard's asset event); one run covers
every batch committed since the last one. Settings come from the environment with
embedded defaults (the same convention as example_ingest.py):

    SHARDSINK_DEMO_ROOT      base folder of the defaults below (default: <repo>/.demo)
    SHARDSINK_SHARD          the input: the example ingest shard   [<root>/shards/events]
    SHARDSINK_VIEW           the view's output shard URL           [<root>/shards/events_per_user_day]
    SHARDSINK_VIEW_DAG_ID    [example_view]
    SHARDSINK_START          first day (ISO date; also the view's initial upper) [2024-01-01]
    SHARDSINK_MAX_ATTEMPTS / SHARDSINK_RETRY_BACKOFF / SHARDSINK_TASK_RETRIES / SHARDSINK_TASK_RETRY_DELAY_S
    SHARDSINK_ENGINE         submit: the write job a spark-submit; connect: a client session of the
                             Spark Connect server of connection ``spark_connect_default``  [submit]
    SHARDSINK_ICEBERG        1: keep an Iceberg view of the output shard (``make run`` sets it)  [0]
"""

import os
from datetime import UTC, datetime
from pathlib import Path

from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, view_dag
from shardsink.sinks.materialize import ViewInput, view

env = os.environ.get
root = Path(env("SHARDSINK_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo")))

EVENTS_PER_USER_DAY = """
    SELECT user, to_date(timestamp_millis(_time)) AS day, sum(_diff) AS events
    FROM events
    GROUP BY user, to_date(timestamp_millis(_time))
    HAVING sum(_diff) <> 0
"""

dag = view_dag(
    dag_id=env("SHARDSINK_VIEW_DAG_ID", "example_view"),
    output_url=env("SHARDSINK_VIEW", str(root / "shards" / "events_per_user_day")),
    view=view(inputs={"events": ViewInput(env("SHARDSINK_SHARD", str(root / "shards" / "events")), mode="updates")},
              sql=EVENTS_PER_USER_DAY),
    schedule="inputs",
    start_date=datetime.fromisoformat(env("SHARDSINK_START", "2024-01-01")).replace(tzinfo=UTC),
    attempts=AttemptOptions.from_env(),  # SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, ... (ATTEMPT_ENV)
    shard=ShardOptions(aws_conn_id=env("SHARDSINK_AWS_CONN_ID") or None,
                       iceberg=env("SHARDSINK_ICEBERG", "0") == "1"),
    spark=SparkOptions(engine=env("SHARDSINK_ENGINE", "submit")),  # type: ignore[arg-type]  # checked there
)
