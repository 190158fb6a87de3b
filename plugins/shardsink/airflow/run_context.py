"""What a sink task reads from (and leaves in) its Airflow context: the run's data
interval, its params (``dry_run``, ``reprocess*``), when it started, the mint's plan XCom
and the append results of the run's earlier attempts.

Pure reads of the context dict (plus the one plan push); no shard or source I/O. XCom values
are decoded here, once and typed (:mod:`shardsink.airflow.results`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shardsink.airflow.results import AppendReport, MintTarget
from shardsink.sinks.description import decode, to_builtins


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def partition_key_of(context: dict[str, Any]) -> str | None:
    """The run's partition key (Airflow 3.2+ partitioned runs), None for an interval run."""
    key = context.get("partition_key")
    return key if key is not None else getattr(context.get("dag_run"), "partition_key", None)


def interval_of(context: dict[str, Any]) -> tuple[int | None, int | None]:
    """The run's data interval in ms (``airflow dags test D L`` covers the period ending at L).

    A run with a partition key covers the interval the key names under the DAG's timetable
    (:func:`shardsink.airflow.partitions.partition_interval`), whatever data interval it
    carries; InvalidUsageError names a key that names none (the mints turn it into a failed
    task before anything is written)."""
    key = partition_key_of(context)
    if key is not None:
        from shardsink.airflow.partitions import partition_interval

        lower, upper = partition_interval(context["dag"].timetable, key)
        return lower, upper
    end = _millis(context.get("data_interval_end")) or _millis(context.get("logical_date"))
    return _millis(context.get("data_interval_start")), end


@dataclass(frozen=True)
class RunOptions:
    """What a run's params / conf ask for (DAG params ``dry_run``, ``reprocess*``), and the
    run's interval in ms (:func:`interval_of`, decoded once: a partition key's decoding walks
    its timetable's ticks)."""

    dry_run: bool
    corrects: tuple[int, int] | None
    interval: tuple[int | None, int | None] = (None, None)


def run_options(context: dict[str, Any]) -> RunOptions:
    """The run's options from its params (run conf overrides DAG params); InvalidUsageError on bad ones."""
    from shardsink.sinks.reprocess import requested_range

    params = dict(context.get("params") or {})
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    params.update(conf)
    dry = params.get("dry_run") in (True, "true", "True", 1)
    interval = interval_of(context)
    return RunOptions(dry, requested_range(params, interval=interval), interval)


def run_started(context: dict[str, Any]) -> float:
    """When the run started (epoch seconds; now if the context does not tell)."""
    started = getattr(context.get("dag_run"), "start_date", None)
    return started.timestamp() if isinstance(started, datetime) else time.time()


def run_writer(context: dict[str, Any], *, dag_id: str | None = None) -> str:
    """The writer every commit of this DAG run carries (appends and maintenance alike):
    ``airflow:<dag_id>/<run_id>``, so ``shardsink log`` maps each commit to its run.
    ``dag_id``: the DAG's id when the caller knows it (else the DAG run's)."""
    run = context["dag_run"]
    return f"airflow:{dag_id if dag_id is not None else run.dag_id}/{run.run_id}"


#: The XCom key of a mint's :class:`MintTarget`; and the key runs started before it was named so.
TARGET_KEY, OLD_TARGET_KEY = "target", "plan"


def push_target(context: dict[str, Any], target: MintTarget) -> None:
    context["ti"].xcom_push(key=TARGET_KEY, value=to_builtins(target))


def target_of(context: dict[str, Any], attempt: int) -> MintTarget | None:
    """The target attempt ``attempt``'s mint pushed (None if it pushed none)."""
    task = f"attempt_{attempt}.mint"
    got = context["ti"].xcom_pull(task_ids=task, key=TARGET_KEY)
    if got is None:  # a run in flight across the upgrade
        got = context["ti"].xcom_pull(task_ids=task, key=OLD_TARGET_KEY)
    return None if got is None else decode(got, MintTarget, what=f"XCom target of {task}")


def targets(context: dict[str, Any], attempts: int) -> list[MintTarget]:
    """The targets of the mints of attempts 1..attempts of this run (those that pushed one)."""
    return [p for k in range(1, attempts + 1) if (p := target_of(context, k)) is not None]


def earlier_appends(context: dict[str, Any], attempt: int) -> list[AppendReport]:
    """The append results of attempts 1..attempt-1 of this run (those that ran)."""
    ti = context["ti"]
    out = []
    for k in range(1, attempt):
        got = ti.xcom_pull(task_ids=f"attempt_{k}.append")
        if got is not None:
            out.append(decode(got, AppendReport, what=f"XCom return_value of attempt_{k}.append"))
    return out
