"""Example reclocked pipeline: a Kafka topic (JSON records) → one shard.

Each run binds every partition's high watermark to its interval end (capped at now) in
the remap shard, the writer slots read exactly the bound offset ranges with kafka-python
on the Spark executors, and after the commit the resumption frontier is committed as the
consumer group's offsets. Settings from the environment:

    SHARDSINK_KAFKA_BOOTSTRAP  host:port[,host:port]                [127.0.0.1:9092]
    SHARDSINK_KAFKA_TOPIC      topic                                [events]
    SHARDSINK_KAFKA_GROUP      consumer group mirroring progress    [shardsink-<topic>]
    SHARDSINK_KAFKA_SHARD      data shard URL                       [<root>/shards/kafka]
    SHARDSINK_KAFKA_REMAP      remap shard URL                      [<data shard>-remap]
    SHARDSINK_COLUMNS          JSON {"column": "type"} of the records [{"id": "int64", "v": "string"}]
    SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, SHARDSINK_TASK_RETRIES, ...: the runs' attempts
                            (shardsink.airflow.options.ATTEMPT_ENV; unset: AttemptOptions' defaults)
"""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from shardsink.airflow import AttemptOptions, SparkOptions, ingest_dag
from shardsink.sources.kafka import KafkaSource

env = os.environ.get
root = Path(env("SHARDSINK_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo")))
shard = env("SHARDSINK_KAFKA_SHARD", str(root / "shards" / "kafka"))
topic = env("SHARDSINK_KAFKA_TOPIC", "events")

dag = ingest_dag(
    dag_id="example_kafka",
    shard_url=shard,
    source=KafkaSource(
        env("SHARDSINK_KAFKA_BOOTSTRAP", "127.0.0.1:9092"), topic,
        remap=env("SHARDSINK_KAFKA_REMAP", shard.rstrip("/") + "-remap"),
        group_id=env("SHARDSINK_KAFKA_GROUP", f"shardsink-{topic}"),
        columns=json.loads(env("SHARDSINK_COLUMNS", "") or '{"id": "int64", "v": "string"}'),
    ),
    writers=int(env("SHARDSINK_WRITERS", "2")),
    schedule="@daily",
    start_date=datetime.fromisoformat(env("SHARDSINK_START", "2024-01-01")).replace(tzinfo=UTC),
    attempts=AttemptOptions.from_env(),  # SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, ...
    spark=SparkOptions(conf={"spark.sql.shuffle.partitions": "2"}),
)
