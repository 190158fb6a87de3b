"""The flat keyword arguments of ``ingest_dag`` / ``view_dag`` that the option objects
replaced (:mod:`shardsink.airflow.options`), kept working for one release.

Each alias names the option object and the field it sets; using one emits a
:class:`FlatOptionWarning` (a ``FutureWarning``: meant for DAG authors, so Python shows it by
default and Airflow lists it among the DAG file's import warnings) saying so (pointing at
the DAG file's line) and sets that field, over the option object given, if any. To be
removed in the release after the one that introduced the option objects.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shardsink.airflow.options import AttemptOptions, ShardOptions, SparkOptions


class FlatOptionWarning(FutureWarning):
    """A deprecated flat keyword of ``ingest_dag`` / ``view_dag`` was used. A ``FutureWarning``,
    not a ``DeprecationWarning``: Python hides the latter outside ``__main__``, so a DAG author
    (and Airflow's DAG import warnings) would never see it."""

#: Deprecated flat keyword -> (option parameter, field of its option object), as ``view_dag`` took them.
VIEW_ALIASES: Mapping[str, tuple[str, str]] = {
    "spark_conn_id": ("spark", "conn_id"),
    "spark_conf": ("spark", "conf"),
    "spark_env": ("spark", "env"),
    "aws_conn_id": ("shard", "aws_conn_id"),
    "initial_upper": ("shard", "initial_upper"),
    "max_span": ("shard", "max_span"),
    "retention": ("shard", "retention"),
    "max_attempts": ("attempts", "max_attempts"),
    "retry_backoff": ("attempts", "backoff"),
    "retry_backoff_cap": ("attempts", "backoff_cap"),
    "task_retries": ("attempts", "task_retries"),
    "task_retry_delay": ("attempts", "task_retry_delay"),
}
#: ``ingest_dag``'s: the view's and its catch-up keywords.
INGEST_ALIASES: Mapping[str, tuple[str, str]] = {
    **VIEW_ALIASES,
    "max_chain": ("attempts", "max_chain"),
    "catch_up_after": ("attempts", "catch_up_after"),
    "poke_interval": ("attempts", "poke_interval"),
}


def with_flat_aliases(
    factory: str, aliases: Mapping[str, tuple[str, str]], kwargs: dict[str, Any], *,
    spark: SparkOptions | None, shard: ShardOptions | None, attempts: AttemptOptions | None,
) -> tuple[SparkOptions, ShardOptions, AttemptOptions]:
    """The option objects of a ``factory(...)`` call: the given ones (or the defaults), with
    the fields its deprecated flat keywords set. Those keywords are removed from ``kwargs``
    (the DAG's extra keyword arguments); each one warns. Call it from the factory itself
    (the warning points two frames up, at the DAG file)."""
    given: dict[str, Any] = {"spark": spark or SparkOptions(), "shard": shard or ShardOptions(),
                             "attempts": attempts or AttemptOptions()}
    changes: dict[str, dict[str, Any]] = {}
    for name in [k for k in kwargs if k in aliases]:
        param, field = aliases[name]
        warnings.warn(f"{factory}({name}=...) is deprecated and will be removed in the next release; use "
                      f"{param}={type(given[param]).__name__}({field}=...)", FlatOptionWarning, stacklevel=3)
        changes.setdefault(param, {})[field] = kwargs.pop(name)
    out = {param: replace(opts, **changes[param]) if param in changes else opts for param, opts in given.items()}
    return out["spark"], out["shard"], out["attempts"]
