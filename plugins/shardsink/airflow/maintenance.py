"""``maintenance_dag(...)``: one maintenance task per shard (advance since, compact, GC, verify).

Graph of one run::

    maintain[url_0 .. url_N-1]      (one mapped task per shard, independent)

Each task runs :func:`shardsink.maintenance.run.maintain` on its shard, logs one line
with batches, parts, bytes and objects before and after, returns the summary as its
XCom (no secrets: URLs, counts and object keys only), and fails if verify found a
problem (the log names each object). The task is a ``@shard_task`` of role ``maintain``
(:mod:`shardsink.provider.operators`): OpenLineage names its map index's shard as input
and output (schema, rows and bytes after the pass), metrics count what it deleted.
Tasks never share a shard, so one GC runs per shard at a time; concurrent GC runs
would still be safe, just wasteful.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context
from airflow.sdk.exceptions import AirflowFailException

from shardsink.airflow.run_context import run_writer
from shardsink.errors import InvalidUsageError
from shardsink.provider.operators import shard_task
from shardsink.storage.url import parse_url

log = logging.getLogger("shardsink.maintenance")


def maintain_task(url: str, *, grace_s: float, compact: bool, advance_since: bool,
                  context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of one mapped task (also callable outside Airflow). ``context``: the task's Airflow
    context; its commits then carry the DAG run's writer (``airflow:<dag_id>/<run_id>``) as an
    append's do (None: host:pid). Returns the summary as structured data (the XCom)."""
    from shardsink.core.shard import Shard
    from shardsink.maintenance.gc_types import GcOptions
    from shardsink.maintenance.run import MaintenanceOptions, maintain

    writer = run_writer(context) if context is not None else None
    summary = maintain(Shard.open(url), MaintenanceOptions(compact=compact, advance_since=advance_since,
                                                            gc=GcOptions(grace_s=grace_s)), writer=writer)
    out = summary.to_dict()
    b, a = summary.before, summary.after
    log.info("SHARDSINK_MAINTENANCE %s: batches %d → %d, parts %d → %d, bytes %s → %s, objects %d → %d, "
             "deleted %d; %s", url, b.batches, a.batches, b.parts, a.parts, f"{b.bytes:,}", f"{a.bytes:,}",
             b.objects, a.objects, out["objects_deleted"], summary.render())
    if not summary.ok:
        problems = "; ".join(f"{p['object']}: {p['message']}" for p in out["problems"][:10])
        raise AirflowFailException(f"verify found {len(out['problems'])} problems on {url}: {problems}")
    return out


def maintenance_dag(
    *,
    dag_id: str,
    shard_urls: Sequence[str],
    schedule: Any = "@daily",
    start_date: datetime = datetime(2024, 1, 1, tzinfo=UTC),
    grace: timedelta = timedelta(hours=1),
    compact: bool = True,
    advance_since: bool = True,
    task_retries: int = 1,
    task_retry_delay: timedelta = timedelta(minutes=5),
    catchup: bool = False,
    tags: list[str] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the maintenance DAG over ``shard_urls`` (one mapped task per shard).

    ``grace``: GC never deletes an object younger than this; it must exceed the longest
    time a writer (or compactor) takes between staging and committing. Runs never
    overlap (``max_active_runs=1``).
    """
    if not shard_urls:
        raise InvalidUsageError("maintenance_dag needs at least one shard URL")
    if grace.total_seconds() < 0:
        raise InvalidUsageError(f"grace {grace} must not be negative")
    urls = [str(parse_url(u)) for u in shard_urls]
    if len(set(urls)) != len(urls):
        raise InvalidUsageError(f"shard URLs are listed twice: {sorted(u for u in urls if urls.count(u) > 1)}")
    grace_s = grace.total_seconds()

    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date,
        catchup=catchup,
        max_active_runs=1,
        tags=tags or ["shardsink", "maintenance"],
        doc_md=f"Compacts, advances since, garbage-collects and verifies {len(urls)} shards "
               f"(grace {grace_s:g} s): {', '.join(urls)}",
        **dag_kwargs,
    ) as dag:

        # shard_url_arg: lineage, metrics and the Shard page link name the map index's shard.
        @shard_task(task_id="maintain", shard_role="maintain", shard_url_arg="url", retries=task_retries,
                    retry_delay=task_retry_delay)
        def maintain(url: str) -> dict[str, Any]:
            return maintain_task(url, grace_s=grace_s, compact=compact, advance_since=advance_since,
                                 context=dict(get_current_context()))

        maintain.expand(url=urls)
    return dag
