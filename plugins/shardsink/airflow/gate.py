"""The retry gate every attempt k >= 2 of a sink DAG passes before minting afresh.

Shared by the ingest and the materialize sink: both unroll fresh-description retries
as TaskGroups ``attempt_1..K`` (see :mod:`shardsink.airflow.factory`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from shardsink.airflow.tasks import IngestSettings, nothing_to_do
from shardsink.core.shard import Shard
from shardsink.sinks.ingest import Description, committed

log = logging.getLogger("shardsink.airflow")


def retry_gate(settings: IngestSettings, attempt: int, context: dict[str, Any]) -> None:
    """Return if attempt ``attempt`` must mint a fresh description; else skip the rest of the run.

    Decides from the SHARD STATE, not from what attempt k-1 reported: skip if attempt
    k-1 minted nothing or its description is committed; otherwise it lost its race, so
    back off (jittered) and return. Attempt 1 always passes.
    """
    if attempt <= 1:
        return
    prev = context["ti"].xcom_pull(task_ids=f"attempt_{attempt - 1}.mint")
    if not prev:
        nothing_to_do(context, f"attempt {attempt - 1} had nothing to write; no retry needed", settings.writers)
    prev_desc = Description.from_dict(prev)
    done = committed(Shard.open(settings.shard_url), prev_desc)
    if done is not None:
        nothing_to_do(context, f"attempt {attempt - 1} committed {prev_desc.desc_id} at seqno {done.seqno}; "
                               "no retry needed", settings.writers)
    pause = settings.backoff(attempt)
    log.info("attempt %d lost its race (description %s was not committed); minting afresh after %.2fs",
             attempt - 1, prev_desc.desc_id, pause)
    settings.sleep(pause)


def submit_env(env_vars: dict[str, str] | None, aws_conn_id: str | None) -> dict[str, str]:
    """The spark-submit environment: ``env_vars`` plus the AWS connection's settings, which are
    also put into this task's own environment (for its shard reads). Never logged."""
    from shardsink.airflow.tasks import aws_env_from_connection

    env = dict(env_vars or {})
    if aws_conn_id:
        creds = aws_env_from_connection(aws_conn_id)
        os.environ.update(creds)
        env.update(creds)
    return env
