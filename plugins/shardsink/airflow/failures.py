"""One policy for turning a shardsink error into an Airflow task outcome.

Used for errors raised in the task process and for errors a spark-submit job reported
in its outcome record (:mod:`shardsink.outcome`), so both decide alike:

* invalid input (late or malformed data, schema mismatch, bad arguments): fail now,
  no Airflow retries (retrying cannot fix the input); the message names the value;
* invalid configuration (a missing Spark connection, a ``yarn`` master without its Hadoop
  configuration, a bad ``AWS_ENDPOINT_URL``): fail now, naming the setting to fix;
* corruption: fail now, loudly (stop and page a human; never guess);
* a storage error that retrying cannot help (access denied, no such bucket): fail now;
* a fate that is unknown (the evidence is older than the retained history): fail now,
  naming it; a retry would get the same answer, and a fresh description could duplicate rows;
* everything else (storage errors, unknown outcomes, lost leases): raised as is, so
  Airflow retries the task.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowFailException

from shardsink.errors import (
    CorruptionError,
    FateUnknownError,
    InvalidConfigurationError,
    InvalidUsageError,
    ShardsinkError,
    StorageError,
)


def for_airflow(e: ShardsinkError) -> BaseException:
    """The exception the task should raise for ``e`` (module docstring); raise it ``from e``."""
    name = type(e).__name__
    if isinstance(e, InvalidConfigurationError):
        return AirflowFailException(f"invalid configuration, not retried: {name}: {e}")
    if isinstance(e, InvalidUsageError):
        return AirflowFailException(f"invalid input, not retried: {name}: {e}")
    if isinstance(e, CorruptionError):
        return AirflowFailException(f"CORRUPTION, not retried (stop and page a human): {name}: {e}")
    if isinstance(e, FateUnknownError):
        return AirflowFailException(f"fate unknown, not retried (check the shard by hand): {name}: {e}")
    if isinstance(e, StorageError) and not e.retryable:
        return AirflowFailException(f"storage error that retrying cannot fix, not retried: {name}: {e}")
    return e
