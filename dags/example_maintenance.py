"""Example maintenance DAG over the demo's shards: advance since, compact, GC, verify, daily.

Settings come from the environment with embedded defaults (as in example_ingest.py):

    SHARDSINK_DEMO_ROOT        base folder of the defaults below (default: <repo>/.demo)
    SHARDSINK_SHARD            the example ingest shard                 [<root>/shards/events]
    SHARDSINK_VIEW             the example view shard                   [<root>/shards/events_per_user_day]
    SHARDSINK_MAINTENANCE_SHARDS  comma-separated shard URLs (overrides the two above)
    SHARDSINK_MAINTENANCE_DAG_ID  [example_maintenance]
    SHARDSINK_GC_GRACE_S       GC grace period in seconds               [3600]
"""

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shardsink.airflow import maintenance_dag

env = os.environ.get
root = Path(env("SHARDSINK_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo")))
listed = [u for u in env("SHARDSINK_MAINTENANCE_SHARDS", "").split(",") if u.strip()]

dag = maintenance_dag(
    dag_id=env("SHARDSINK_MAINTENANCE_DAG_ID", "example_maintenance"),
    shard_urls=listed or [env("SHARDSINK_SHARD", str(root / "shards" / "events")),
                          env("SHARDSINK_VIEW", str(root / "shards" / "events_per_user_day"))],
    schedule="@daily",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    grace=timedelta(seconds=float(env("SHARDSINK_GC_GRACE_S", "3600"))),
)
