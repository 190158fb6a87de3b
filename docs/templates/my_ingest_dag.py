"""Template: your own dataset -> one shard, one batch per day. Copy it into your DAG folder,
then change the four lines marked CHANGE (a test parses this file as written).

Before the first run:
* the landing zone follows docs/landing-zone.md: data files (Parquet, CSV, JSONL) with an
  event-time column, and a ``_watermark.json`` published after the files;
* the Spark connection named below exists, e.g. for Spark on the Airflow worker itself:
  AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
  (a missing one fails the write task at once, naming it);
* S3 stores: the standard AWS environment (AWS_ENDPOINT_URL for MinIO and other
  S3-compatible stores), or an Airflow ``aws`` connection named by ShardOptions(aws_conn_id=...).

start_date is required: the start of the first interval and the upper the new shard starts
at. Set it to the first day of your data: a shard that starts long before the data makes
every run write empty batches up to it (the mint's log warns, naming the fix).
"""

from datetime import UTC, datetime, timedelta

from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, ingest_dag
from shardsink.sources import LandingSource

dag = ingest_dag(
    dag_id="my_dataset_ingest",  # CHANGE: unique among your DAGs
    shard_url="s3://my-bucket/shards/my_dataset",  # CHANGE: where the shard lives (s3://, file:// or a path)
    source=LandingSource("s3://my-bucket/landing/my_dataset", time_column="event_time"),  # CHANGE
    start_date=datetime(2025, 1, 1, tzinfo=UTC),  # CHANGE: the first day of your data
    schedule="@daily",  # one run per day; each covers [day, day + 1)
    writers=2,  # spark-submit jobs per run (each reads its share of the files)
    shard=ShardOptions(max_span=timedelta(days=1)),  # each batch at most a day wide
    attempts=AttemptOptions(max_attempts=5, task_retries=2),
    spark=SparkOptions(conn_id="spark_default"),
)
