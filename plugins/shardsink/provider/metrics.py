"""shardsink's metrics, sent through Airflow's metrics (StatsD or OpenTelemetry, per ``[metrics]``).

Names (prefix ``[metrics] statsd_prefix``, default ``airflow``; tags ``dag_id``, ``shard``
where the backend supports tags — StatsD without tags gets the plain names):

==============================================  =======  ==================================================
``shardsink.commits``                           counter  batches committed by append (``already_committed``
                                                         answers excluded: they landed earlier)
``shardsink.lost_races``                        counter  appends that lost their race (a fresh description
                                                         follows)
``shardsink.staged_rows``                       counter  rows of committed batches
``shardsink.staged_bytes``                      counter  bytes of committed batches' parts
``shardsink.task.<role>.duration``              timer    ms spent in a shardsink task's execute, role =
                                                         mint | write | append (ingest and view DAGs alike;
                                                         the dag_id tag tells them apart), maintain (the
                                                         maintenance DAG's per-shard task), or the
                                                         ``shard_role`` another task declares
``shardsink.maintenance.objects_deleted``       counter  objects GC deleted in a maintenance pass (state
                                                         versions, rollups, parts, manifests, leases)
``shardsink.maintenance.part_bytes_deleted``    counter  bytes of the parts GC deleted in that pass
``shardsink.maintenance.batches_before``        gauge    live batches of the shard before the pass
``shardsink.maintenance.batches_after``         gauge    live batches after it (compaction merges batches)
==============================================  =======  ==================================================

Gauges are per shard: without tags (plain StatsD) the last shard maintained wins.

Metrics never fail a task: a broken backend is logged and ignored.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "shardsink"


def _stats() -> Any:
    """The Task SDK's Stats, initialised from ``[metrics]`` if this process has not done so yet.

    SUBTLE: the task runner initialises Stats in its own process; ``airflow dags test`` runs
    tasks in the CLI process, where the SDK's Stats would stay a no-op without this.
    """
    from airflow.sdk._shared.observability.metrics import stats as sdk_stats
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability.metrics import stats_utils

    if getattr(sdk_stats, "_factory", None) is None:
        sdk_stats.initialize(factory=stats_utils.get_stats_factory(),
                             export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
    return sdk_stats


def _tags(dag_id: str | None, shard: str | None) -> dict[str, str]:
    return {k: v for k, v in (("dag_id", dag_id), ("shard", shard)) if v}


def incr(name: str, count: int = 1, *, dag_id: str | None = None, shard: str | None = None) -> None:
    try:
        _stats().incr(f"{PREFIX}.{name}", count, tags=_tags(dag_id, shard))
    except Exception:
        log.warning("could not send metric %s.%s", PREFIX, name, exc_info=True)


def timing(name: str, ms: float, *, dag_id: str | None = None, shard: str | None = None) -> None:
    try:
        _stats().timing(f"{PREFIX}.{name}", ms, tags=_tags(dag_id, shard))
    except Exception:
        log.warning("could not send metric %s.%s", PREFIX, name, exc_info=True)


def gauge(name: str, value: float, *, dag_id: str | None = None, shard: str | None = None) -> None:
    try:
        _stats().gauge(f"{PREFIX}.{name}", value, tags=_tags(dag_id, shard))
    except Exception:
        log.warning("could not send metric %s.%s", PREFIX, name, exc_info=True)


def committed(*, dag_id: str, shard: str, rows: int, size: int | None) -> None:
    """One batch committed: commits, staged rows and bytes."""
    incr("commits", dag_id=dag_id, shard=shard)
    incr("staged_rows", rows, dag_id=dag_id, shard=shard)
    if size is not None:
        incr("staged_bytes", size, dag_id=dag_id, shard=shard)


def lost_race(*, dag_id: str, shard: str) -> None:
    incr("lost_races", dag_id=dag_id, shard=shard)


def maintained(*, dag_id: str, shard: str, batches_before: int, batches_after: int, objects_deleted: int,
               part_bytes_deleted: int) -> None:
    """One maintenance pass over ``shard`` succeeded (verify found nothing)."""
    incr("maintenance.objects_deleted", objects_deleted, dag_id=dag_id, shard=shard)
    incr("maintenance.part_bytes_deleted", part_bytes_deleted, dag_id=dag_id, shard=shard)
    gauge("maintenance.batches_before", batches_before, dag_id=dag_id, shard=shard)
    gauge("maintenance.batches_after", batches_after, dag_id=dag_id, shard=shard)
