"""Airflow integration (Task SDK only): ``ingest_dag(...)`` builds a persistence DAG,
``view_dag(...)`` a self-correcting materialized view over shards (both configured with the
option objects ``SparkOptions``, ``ShardOptions``, ``AttemptOptions``), ``maintenance_dag(...)``
compaction, GC and verification of shards."""

from shardsink.airflow.factory import ingest_dag, shard_asset
from shardsink.airflow.maintenance import maintenance_dag
from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions
from shardsink.airflow.partitions import InputPartitions, daily_partitions, hourly_partitions
from shardsink.airflow.view import ViewWriteOperator
from shardsink.airflow.view_factory import view_dag
from shardsink.airflow.write_operator import ShardWriteOperator

__all__ = [
    "AttemptOptions", "InputPartitions", "ShardOptions", "ShardWriteOperator", "SparkOptions", "ViewWriteOperator",
    "daily_partitions", "hourly_partitions", "ingest_dag", "maintenance_dag", "shard_asset", "view_dag",
]
