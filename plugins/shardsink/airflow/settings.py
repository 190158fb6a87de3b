"""The static settings every task of one sink DAG shares: :class:`IngestSettings`.

Built once per DAG file parse by :mod:`shardsink.airflow.build` (from the factories'
option objects) and handed to every task body; range-checked on construction, so a DAG
file with a bad value fails to parse, naming it (:class:`InvalidUsageError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shardsink.core import checks as ck
from shardsink.storage.retry import RetryPolicy


@dataclass(frozen=True)
class IngestSettings:
    """Everything the tasks of one sink DAG share (static, set by the DAG file).

    For a materialize (view) DAG ``source_spec`` holds the view spec and ``writers`` is 1.
    ``max_attempts`` bounds the attempt groups of a run (each commits up to ``max_chain``
    descriptions); ``catch_up_after`` is how long a run whose earlier interval is not
    covered yet waits for the shard to progress before catching up itself; while waiting
    it is deferred to the triggerer, which reads the shard every ``poke_interval`` seconds
    (holding no worker slot). A lost race defers the next attempt's mint until
    :meth:`backoff` has passed (the :attr:`attempts_policy`).
    """

    dag_id: str
    shard_url: str
    source_spec: dict[str, Any]
    writers: int
    max_span: int | None
    max_attempts: int
    initial_upper: int
    backoff_base: float = 2.0
    backoff_cap: float = 30.0
    #: The shard's retention to keep set (a duration spec, "none" = all history); None: unmanaged.
    retention: str | None = None
    #: Keep an Iceberg view of the shard (``ShardOptions.iceberg``): turned on after the first commit.
    iceberg: bool = False
    #: Airflow ``aws`` connection for S3 stores (:mod:`shardsink.airflow.credentials`); None: the environment.
    aws_conn_id: str | None = None
    max_chain: int = 16
    catch_up_after: float = 300.0
    poke_interval: float = 15.0
    sample_rows: int = 5
    #: How long an append minted ahead may wait for its turn (the shard's upper reaching its lower)
    #: before its task fails, naming the description it waits behind (seconds, > 0).
    max_append_wait: float = 86400.0
    #: The Airflow ``spark_connect`` connection of a DAG whose jobs run over Spark Connect
    #: (``SparkOptions(engine="connect")``): its dry runs are sessions of that server. None: a dry
    #: run starts a local Spark session in the task (:mod:`shardsink.spark.dryrun`).
    connect_conn_id: str | None = None

    def __post_init__(self) -> None:
        """Range-check every time, duration and count (a DAG file with a bad one fails to parse, naming it)."""
        ck.check_count(self.writers, what="writers", lo=1)
        ck.check_count(self.max_attempts, what="max_attempts", lo=1)
        ck.check_count(self.max_chain, what="max_chain", lo=1)
        ck.check_count(self.sample_rows, what="sample_rows")
        ck.check_time(self.initial_upper, what="initial_upper")
        if self.max_span is not None:
            ck.check_duration_ms(self.max_span, what="max_span")
        for what, value, positive in (("backoff_base", self.backoff_base, False), ("backoff_cap", self.backoff_cap,
                                      False), ("catch_up_after", self.catch_up_after, False),
                                      ("poke_interval", self.poke_interval, True),
                                      ("max_append_wait", self.max_append_wait, True)):
            ck.check_seconds(value, what=what, positive=positive)

    @property
    def attempts_policy(self) -> RetryPolicy:
        """The attempt groups' backoff: ``max_attempts`` tries, full jitter from ``backoff_base``
        up to ``backoff_cap``; no deadline of its own (the DAG run's timeouts bound it). Nothing
        sleeps on it: the next mint is deferred (to the triggerer) until then."""
        return RetryPolicy("attempts", attempts=self.max_attempts, first_wait=self.backoff_base,
                           max_wait=self.backoff_cap, deadline=math.inf)

    def backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff before attempt ``attempt`` (>= 2)."""
        return self.attempts_policy.backoff(attempt)
