"""The option objects of the sink DAG factories (``ingest_dag`` and ``view_dag``).

Frozen, keyword-only dataclasses grouped by what the options mean: :class:`SparkOptions`
(how the write tasks run spark-submit), :class:`ShardOptions` (the shard written: its
store credentials, initial upper, batch width, retention) and :class:`AttemptOptions`
(how a run makes progress: fresh attempts after lost races, backoff, task retries,
catching up). Both factories take the same objects and turn them into the DAG's
settings in one place (:mod:`shardsink.airflow.build`), where every value is
range-checked when the DAG file is parsed, as before (:class:`InvalidUsageError`).
The defaults are the factories' defaults. The flat keyword arguments they replace are
deprecated aliases (:mod:`shardsink.airflow.deprecated`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from shardsink.core.state import PART_ORDERS, PartOrder
from shardsink.errors import InvalidUsageError
from shardsink.sources.evolution import SchemaMode, check_schema_mode

#: How a write task runs Spark: its own spark-submit application, or a session of a Connect server.
SparkEngine = Literal["submit", "connect"]


@dataclass(frozen=True, kw_only=True)
class SparkOptions:
    """How the write tasks run Spark (the ``spark=`` option).

    ``engine``: ``"submit"`` (default) runs each write slot as its own spark-submit application;
    ``"connect"`` runs it as one client session of a long-running Spark Connect server
    (:mod:`shardsink.spark.connect`: ingest write slots, corrections and view jobs; a row-wise
    view then compares in full every run, see the README's engine section). ``conn_id``: the Airflow Spark connection
    (spark-submit); ``connect_conn_id``: the Airflow ``spark_connect`` connection (Connect);
    ``conf``: Spark settings, added to the factory's defaults (``spark.ui.enabled=false``, two
    shuffle partitions; views also run in UTC; spark-submit only: a Connect server has its
    own); ``env``: extra environment variables of spark-submit.
    """

    engine: SparkEngine = "submit"
    conn_id: str = "spark_default"
    connect_conn_id: str = "spark_connect_default"
    conf: Mapping[str, str] | None = None
    env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.engine not in ("submit", "connect"):
            raise InvalidUsageError(f"SparkOptions(engine=...) must be 'submit' or 'connect', got {self.engine!r}",
                                    value=str(self.engine))



@dataclass(frozen=True, kw_only=True)
class ShardOptions:
    """The shard the DAG writes (the ``shard=`` option).

    ``initial_upper``: the upper a newly created shard starts at (default: the DAG's
    ``start_date``); ``max_span``: the widest batch one description covers (a timedelta
    or ms; None: unbounded); ``retention`` (e.g. ``"7d"`` or a timedelta; ``"none"``: all
    history) is set on the shard by the append task when it differs, None leaves it
    alone; ``aws_conn_id``: an Airflow ``aws`` connection for S3 stores, resolved by the
    amazon provider's hook for every task and for spark-submit's environment, never
    logged or stored (:mod:`shardsink.airflow.credentials`); None: the AWS environment.
    ``part_order`` (``ingest_dag`` only; views keep sorted parts): how the write jobs stage
    parts, ``"sorted"`` (consolidated and sorted on the executors) or ``"unordered"`` (the
    executors' rows as they come, no sort: faster ingest; reads are the same, and
    compaction sorts them later). See :data:`shardsink.core.state.PartOrder`. None (the
    default): ``"unordered"`` for ingest, chosen by the benchmarks (less CPU to stage in every
    arm, snapshot before compaction 0.74x CPU of sorted parts), ``"sorted"`` for views.
    """

    initial_upper: int | None = None
    max_span: timedelta | int | None = None
    retention: timedelta | str | None = None
    aws_conn_id: str | None = None
    part_order: PartOrder | None = None
    #: Keep an Iceberg view of the shard (:mod:`shardsink.iceberg`): the append task turns it on after
    #: its commit when the shard does not have it yet; every later commit keeps it current.
    iceberg: bool = False

    def checked_part_order(self, *, default: PartOrder = "unordered") -> PartOrder:
        """``part_order`` (``default`` when None), or InvalidUsageError naming it (at DAG parse time)."""
        if self.part_order is None:
            return default
        if self.part_order not in PART_ORDERS:
            raise InvalidUsageError(f"part_order must be 'sorted' or 'unordered', got {self.part_order!r}",
                                    value=str(self.part_order))
        return self.part_order


def checked_schema_mode(mode: object) -> SchemaMode:
    """``ingest_dag``'s ``schema_mode`` (``"strict"`` or ``"add_columns"``,
    :data:`shardsink.sources.evolution.SCHEMA_MODES`),
    or InvalidUsageError naming it (at DAG parse time). See :mod:`shardsink.sources.evolution`."""
    return check_schema_mode(mode)


@dataclass(frozen=True, kw_only=True)
class AttemptOptions:
    """How a run makes progress (the ``attempts=`` option).

    ``max_attempts`` bounds the fresh descriptions (attempt groups) of a run after lost
    races, with full-jitter backoff ``backoff * 2^(k-2)`` seconds capped at
    ``backoff_cap``; ``task_retries`` / ``task_retry_delay`` are Airflow's retries of
    every task (a retried task never duplicates data). Ingest runs only: an attempt
    commits at most ``max_chain`` descriptions; a run behind an uncovered earlier
    interval waits up to ``catch_up_after`` without shard progress before catching up
    itself, looking again every ``poke_interval`` (holding no worker slot). A backfill's later
    runs mint and stage ahead; each append then waits its turn (deferred, the same pokes) at
    most ``max_append_wait``, then fails naming the description and run it waits behind.
    """

    max_attempts: int = 5
    backoff: float = 2.0
    backoff_cap: float = 30.0
    task_retries: int = 2
    task_retry_delay: timedelta = timedelta(seconds=30)
    max_chain: int = 16
    catch_up_after: timedelta = timedelta(minutes=5)
    poke_interval: timedelta = timedelta(seconds=15)
    max_append_wait: timedelta = timedelta(hours=24)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AttemptOptions:
        """The defaults, with each option whose variable (:data:`ATTEMPT_ENV`) is set taken from it
        (seconds for the durations): one reading for every example DAG and deployment that
        configures its runs from the environment. InvalidUsageError names a malformed variable."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, var in ATTEMPT_ENV.items():
            text = env.get(var)
            if not text:
                continue
            kind = type(getattr(cls(), name))
            try:
                number = float(text) if kind is not int else int(text)
            except ValueError:
                raise InvalidUsageError(f"{var}={text!r} is not a number", value=text) from None
            values[name] = timedelta(seconds=number) if kind is timedelta else number
        return cls(**values)  # type: ignore[arg-type]


#: The environment variable of each :class:`AttemptOptions` field read by :meth:`AttemptOptions.from_env`.
ATTEMPT_ENV = {
    "max_attempts": "SHARDSINK_MAX_ATTEMPTS", "backoff": "SHARDSINK_RETRY_BACKOFF",
    "backoff_cap": "SHARDSINK_RETRY_BACKOFF_CAP", "task_retries": "SHARDSINK_TASK_RETRIES",
    "task_retry_delay": "SHARDSINK_TASK_RETRY_DELAY_S", "max_chain": "SHARDSINK_MAX_CHAIN",
    "catch_up_after": "SHARDSINK_CATCH_UP_AFTER_S", "poke_interval": "SHARDSINK_POKE_S",
    "max_append_wait": "SHARDSINK_MAX_APPEND_WAIT_S",
}
