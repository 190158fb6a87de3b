"""Airflow integration: ``ingest_dag(...)`` builds a persistence DAG (Task SDK only)."""

from shardsink.airflow.factory import ingest_dag, shard_asset
from shardsink.airflow.tasks import ShardWriteOperator

__all__ = ["ShardWriteOperator", "ingest_dag", "shard_asset"]
