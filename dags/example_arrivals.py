"""Example reclocked pipeline: files arriving under a folder (no watermark) → one shard.

Each run binds the files that arrived (and settled) since the last binding to its
interval end (capped at now) in the remap shard, then writes exactly those files, every
row stamped with its binding time. Settings from the environment (its own: no other
example writes these shards):

    SHARDSINK_DEMO_ROOT          base folder of the defaults below (default: <repo>/.demo)
    SHARDSINK_ARRIVALS           folder or s3:// prefix files arrive under  [<root>/arrivals]
    SHARDSINK_ARRIVALS_SHARD     data shard URL                             [<root>/shards/arrivals]
    SHARDSINK_ARRIVALS_REMAP     remap shard URL                            [<data shard>-remap]
    SHARDSINK_ARRIVALS_SETTLE_S  seconds a file must be unmodified before it is bound [30]
    SHARDSINK_ARRIVALS_COLUMNS   JSON {"column": "type"} of the files (default: the first file's)
    SHARDSINK_ARRIVALS_DAG_ID    [example_arrivals]
    SHARDSINK_ENGINE, SHARDSINK_WRITERS, SHARDSINK_START and the runs' attempts (SHARDSINK_MAX_ATTEMPTS, ...:
    shardsink.airflow.options.ATTEMPT_ENV): shared by the examples [submit, 2, 2024-01-01, AttemptOptions' defaults]
"""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from shardsink.airflow import AttemptOptions, SparkOptions, ingest_dag
from shardsink.sources.files import FileArrivals

env = os.environ.get
root = Path(env("SHARDSINK_DEMO_ROOT", str(Path(__file__).resolve().parents[1] / ".demo")))
shard = env("SHARDSINK_ARRIVALS_SHARD", str(root / "shards" / "arrivals"))

dag = ingest_dag(
    dag_id=env("SHARDSINK_ARRIVALS_DAG_ID", "example_arrivals"),
    shard_url=shard,
    source=FileArrivals(
        env("SHARDSINK_ARRIVALS", str(root / "arrivals")),
        remap=env("SHARDSINK_ARRIVALS_REMAP", shard.rstrip("/") + "-remap"),
        settle_seconds=float(env("SHARDSINK_ARRIVALS_SETTLE_S", "30")),
        columns=json.loads(env("SHARDSINK_ARRIVALS_COLUMNS", "{}")) or None,
    ),
    writers=int(env("SHARDSINK_WRITERS", "2")),
    schedule="@daily",
    start_date=datetime.fromisoformat(env("SHARDSINK_START", "2024-01-01")).replace(tzinfo=UTC),
    attempts=AttemptOptions.from_env(),  # SHARDSINK_MAX_ATTEMPTS, SHARDSINK_RETRY_BACKOFF, ...
    spark=SparkOptions(conf={"spark.sql.shuffle.partitions": "2"},
                       engine=env("SHARDSINK_ENGINE", "submit")),  # type: ignore[arg-type]  # checked there
)
