"""The TaskGroups ``attempt_1..K`` and the ``report`` task every sink DAG is made of.

::

    attempt_1: mint ─► write[desc × slot] (spark-submit) ─► append ─┐
                                                                     │ covered → rest skipped
    attempt_2: mint (trigger rule none_failed) ─► ...                │ else: continue / retry
    ...                                                              ▼
    attempt_K: ...                                    report (trigger rule none_failed)

``mint`` returns a CHAIN of descriptions from the shard's upper towards the run's target
(``min(interval end, source progress)``, each at most ``max_span`` wide); the writes are
mapped over (description, slot) pairs (a re-processing run's correcting description is
staged whole by its slot 0, see :class:`shardsink.airflow.reprocess.IngestWriteOperator`),
and ``append`` commits the chain in order. A run
continues with the next attempt while its target is not covered (a lost race, a chain cut
at ``max_chain``); ``report`` lists what the run committed and fails the run unless its
target is covered: a green run covers its interval, whatever the concurrency.
Waits (an earlier interval not covered yet, backoff after a lost race) defer the mint
task to Airflow's triggerer (:mod:`shardsink.airflow.triggers`): no worker slot is held
while waiting, and the deployment needs a running triggerer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, TaskGroup, TriggerRule, get_current_context, task

from shardsink.airflow.credentials import store_access
from shardsink.airflow.gates import REPORT
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.tasks import append_task, report_task
from shardsink.provider.operators import shard_task

#: ``mint(settings, attempt, context) -> list of description dicts`` (or skip the rest of the run).
MintBody = Callable[[IngestSettings, int, dict[str, Any]], list[dict[str, Any]]]
#: Builds the (mapped) operator(s) of one attempt from the mint task's XCom (the description list).
MakeWrite = Callable[[Any], Any]


def attempt_groups(*, settings: IngestSettings, asset: Asset, mint_body: MintBody, make_write: MakeWrite,
                   task_retries: int, task_retry_delay: timedelta) -> None:
    """Add ``settings.max_attempts`` attempt TaskGroups and the ``report`` task to the DAG being defined."""
    retry: dict[str, Any] = {"retries": task_retries, "retry_delay": task_retry_delay}
    # Lineage, the Shard page link and metrics (shardsink.provider.operators).
    shard: dict[str, Any] = {"shard_url": settings.shard_url, "source_spec": settings.source_spec}
    prev_append = None
    appends = []
    for k in range(1, settings.max_attempts + 1):
        with TaskGroup(group_id=f"attempt_{k}"):
            rule = TriggerRule.ALL_SUCCESS if k == 1 else TriggerRule.NONE_FAILED

            @shard_task(task_id="mint", trigger_rule=rule, shard_role="mint", **shard, **retry)
            def mint(attempt: int = k) -> list[dict[str, Any]]:
                with store_access(settings.aws_conn_id):
                    return mint_body(settings, attempt, dict(get_current_context()))

            descs = mint()
            writes = make_write(descs)

            @shard_task(task_id="append", outlets=[asset], trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
                        shard_role="append", **shard, **retry)
            def append(d: Any, attempt: int = k) -> dict[str, Any]:
                with store_access(settings.aws_conn_id):
                    return append_task(settings, attempt, d, dict(get_current_context()), asset)

            done = append(descs)
            writes >> done
            if prev_append is not None:
                prev_append >> descs
            prev_append = done
            appends.append(done)

    @task(task_id=REPORT, trigger_rule=TriggerRule.NONE_FAILED)
    def report() -> dict[str, Any]:
        with store_access(settings.aws_conn_id):
            return report_task(settings, dict(get_current_context()))

    r = report()
    for a in appends:
        a >> r
