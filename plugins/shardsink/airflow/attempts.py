"""The TaskGroups ``attempt_1..K`` every sink DAG is made of (ingest and materialize alike).

::

    attempt_1: mint ─► write[slot 0..N-1] (spark-submit) ─► append
                                                              │ lost the race → skipped
    attempt_2: mint (trigger rule none_failed) ─► write[...] ─► append
    ...
    attempt_K: ...                                            append fails loudly if it loses too

``mint`` of attempt k >= 2 runs after a success *or* a skip of append k-1 and decides
from the shard state whether anything is left to do (:func:`shardsink.airflow.tasks.retry_gate`).
The sinks differ only in the mint body and the write operator; append is shared
(:func:`shardsink.airflow.tasks.append_task`, which emits the shard's asset event).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, TaskGroup, TriggerRule, get_current_context

from shardsink.airflow.credentials import store_access
from shardsink.airflow.tasks import IngestSettings, append_task
from shardsink.provider.operators import shard_task

#: ``mint(settings, attempt, context) -> description dict`` (or skip the rest of the run).
MintBody = Callable[[IngestSettings, int, dict[str, Any]], dict[str, Any]]
#: Builds the (mapped) write operator(s) of one attempt from the mint task's XCom.
MakeWrite = Callable[[Any], Any]


def attempt_groups(*, settings: IngestSettings, asset: Asset, mint_body: MintBody, make_write: MakeWrite,
                   task_retries: int, task_retry_delay: timedelta) -> None:
    """Add ``settings.max_attempts`` attempt TaskGroups to the DAG being defined."""
    retry: dict[str, Any] = {"retries": task_retries, "retry_delay": task_retry_delay}
    # Lineage, the Shard page link and metrics (shardsink.provider.operators).
    shard: dict[str, Any] = {"shard_url": settings.shard_url, "source_spec": settings.source_spec}
    prev_append = None
    for k in range(1, settings.max_attempts + 1):
        with TaskGroup(group_id=f"attempt_{k}"):
            rule = TriggerRule.ALL_SUCCESS if k == 1 else TriggerRule.NONE_FAILED

            @shard_task(task_id="mint", trigger_rule=rule, shard_role="mint", **shard, **retry)
            def mint(attempt: int = k) -> dict[str, Any]:
                with store_access(settings.aws_conn_id):
                    return mint_body(settings, attempt, dict(get_current_context()))

            desc = mint()
            write = make_write(desc)

            @shard_task(task_id="append", outlets=[asset], shard_role="append", **shard, **retry)
            def append(d: Any, attempt: int = k) -> dict[str, Any]:
                with store_access(settings.aws_conn_id):
                    return append_task(settings, attempt, d, dict(get_current_context()), asset)

            done = append(desc)
            write >> done
            if prev_append is not None:
                prev_append >> desc
            prev_append = done
