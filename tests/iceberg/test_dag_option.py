"""``ingest_dag(shard=ShardOptions(iceberg=True))`` / ``view_dag(…)``: the option reaches the append
task's settings, which turns the view on after its commit (once)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from shardsink import iceberg
from shardsink.airflow.build import sink_settings
from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions
from shardsink.airflow.tasks import ensure_iceberg
from shardsink.core.shard import Shard


def test_the_option_reaches_the_settings_and_turns_the_view_on_once(tmp_path: object) -> None:
    url = f"file://{tmp_path}/s"
    on = sink_settings(dag_id="d", url=url, spec={}, writers=1, start_date=datetime(2026, 1, 1, tzinfo=UTC),
                       shard=ShardOptions(iceberg=True), attempts=AttemptOptions(), spark=SparkOptions())
    off = sink_settings(dag_id="d", url=url, spec={}, writers=1, start_date=datetime(2026, 1, 1, tzinfo=UTC),
                        shard=ShardOptions(), attempts=AttemptOptions(), spark=SparkOptions())
    assert on.iceberg and not off.iceberg
    shard = Shard.create(url, pa.schema([("k", pa.string())]))
    shard.append(pa.table({"k": ["a"], "_time": [1], "_diff": [1]}), lower=0, upper=10)
    ensure_iceberg(shard, writer="dag-run")
    seqno = shard.reader().head().seqno
    assert iceberg.find(shard) == seqno
    ensure_iceberg(shard, writer="dag-run")
    assert shard.reader().head().seqno == seqno  # already on: nothing committed
    shard.append(pa.table({"k": ["b"], "_time": [11], "_diff": [1]}), lower=10, upper=20)
    assert iceberg.find(shard) == seqno + 1
