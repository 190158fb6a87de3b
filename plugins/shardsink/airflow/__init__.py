"""Airflow integration (Task SDK only): ``ingest_dag(...)`` builds a persistence DAG,
``view_dag(...)`` a self-correcting materialized view over shards, ``maintenance_dag(...)``
compaction, GC and verification of shards."""

from shardsink.airflow.factory import ingest_dag, shard_asset
from shardsink.airflow.maintenance import maintenance_dag
from shardsink.airflow.tasks import ShardWriteOperator
from shardsink.airflow.view import ViewWriteOperator
from shardsink.airflow.view_factory import view_dag

__all__ = ["ShardWriteOperator", "ViewWriteOperator", "ingest_dag", "maintenance_dag", "shard_asset", "view_dag"]
