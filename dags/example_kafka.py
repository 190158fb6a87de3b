"""Example reclocked pipeline: a Kafka topic (JSON records) → one shard.

Each run binds every partition's high watermark to its interval end (capped at now) in
the remap shard, the writer slots read exactly the bound offset ranges with kafka-python
on the Spark executors, and after the commit the resumption frontier is committed as the
consumer group's offsets.

Defined only where a broker is configured (``SHARDSINK_KAFKA_BOOTSTRAP``): the demo and
the compose stack run no Kafka, so there this file defines no DAG. Settings from the
environment (its own: no other example writes these shards):

    SHARDSINK_KAFKA_BOOTSTRAP  host:port[,host:port]                [required]
    SHARDSINK_KAFKA_TOPIC      topic                                [events]
    SHARDSINK_KAFKA_GROUP      consumer group mirroring progress    [shardsink-<topic>]
    SHARDSINK_KAFKA_SHARD      data shard URL                       [<root>/shards/kafka]
    SHARDSINK_KAFKA_REMAP      remap shard URL                      [<data shard>-remap]
    SHARDSINK_KAFKA_COLUMNS    JSON {"column": "type"} of the records [{"id": "int64", "v": "string"}]
    SHARDSINK_DEMO_ROOT        base folder of the default shard (default: <repo>/.demo)
    SHARDSINK_WRITERS, SHARDSINK_START and the runs' attempts (SHARDSINK_MAX_ATTEMPTS, ...:
    shardsink.airflow.options.ATTEMPT_ENV): shared by the examples [2, 2024-01-01, AttemptOptions' defaults]
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
bootstrap = env("SHARDSINK_KAFKA_BOOTSTRAP", "")

if bootstrap:
    dag = ingest_dag(
        dag_id="example_kafka",
        shard_url=shard,
        source=KafkaSource(
            bootstrap, topic,
            remap=env("SHARDSINK_KAFKA_REMAP", shard.rstrip("/") + "-remap"),
            group_id=env("SHARDSINK_KAFKA_GROUP", f"shardsink-{topic}"),
            columns=json.loads(env("SHARDSINK_KAFKA_COLUMNS", "") or '{"id": "int64", "v": "string"}'),
        ),
        writers=int(env("SHARDSINK_WRITERS", "2")),
        schedule="@daily",
        start_date=datetime.fromisoformat(env("SHARDSINK_START", "2024-01-01")).replace(tzinfo=UTC),
        attempts=AttemptOptions.from_env(),  # SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, ...
        spark=SparkOptions(conf={"spark.sql.shuffle.partitions": "2"}),
    )
