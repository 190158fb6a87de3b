"""The store configuration: :class:`StoreOptions` (S3 timeouts, connection pool, retry policy).

Taken by :func:`shardsink.storage.url.open_blob` and :func:`shardsink.storage.s3.make_client`.
When none is given, an S3 client uses the options of the :class:`~shardsink.storage.s3.S3Access`
in effect (an Airflow connection's ``config_kwargs``, see :mod:`shardsink.airflow.credentials`),
else :meth:`StoreOptions.from_env`: ``SHARDSINK_S3_CONNECT_TIMEOUT`` and
``SHARDSINK_S3_READ_TIMEOUT`` (seconds; 5 and 30 when unset), and the conditional-write probe's
opt-out ``SHARDSINK_S3_TRUST_CONDITIONAL_WRITES`` (``1``/``true``/``yes`` or ``0``/``false``/``no``;
see :mod:`shardsink.storage.probe`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from shardsink.errors import InvalidUsageError
from shardsink.storage.retry import STORAGE, RetryPolicy

#: Environment variable of each timeout field (read by :meth:`StoreOptions.from_env`).
ENV = {"connect_timeout": "SHARDSINK_S3_CONNECT_TIMEOUT", "read_timeout": "SHARDSINK_S3_READ_TIMEOUT"}
#: The environment variable of :attr:`StoreOptions.trust_conditional_writes`.
TRUST_ENV = "SHARDSINK_S3_TRUST_CONDITIONAL_WRITES"
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class StoreOptions:
    """How a store is reached: botocore's timeouts (seconds) and connection pool for S3, and
    the retry policy of idempotent requests (every store, :class:`~shardsink.storage.retry.RetryingBlob`)."""

    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_pool: int = 32
    retry: RetryPolicy = STORAGE
    #: Skip the conditional-write probe (:mod:`shardsink.storage.probe`): ONLY for a store the
    #: operator verified honours If-None-Match and If-Match by other means. Logged loudly.
    trust_conditional_writes: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.trust_conditional_writes, bool):
            raise InvalidUsageError(f"store option trust_conditional_writes {self.trust_conditional_writes!r} "
                                    "must be True or False", value=repr(self.trust_conditional_writes))
        for what in ("connect_timeout", "read_timeout"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InvalidUsageError(f"store option {what} {value!r} must be a positive number of seconds",
                                        value=repr(value))
        if isinstance(self.max_pool, bool) or not isinstance(self.max_pool, int) or self.max_pool < 1:
            raise InvalidUsageError(f"store option max_pool {self.max_pool!r} must be a positive integer",
                                    value=repr(self.max_pool))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StoreOptions:
        """The defaults, with each timeout whose variable (:data:`ENV`) is set taken from it, and
        the probe opt-out from :data:`TRUST_ENV`."""
        env = os.environ if environ is None else environ
        base = cls(trust_conditional_writes=_flag(env.get(TRUST_ENV, ""), TRUST_ENV))
        return base.override({f: _seconds(env[var], var) for f, var in ENV.items() if env.get(var)})

    def override(self, values: Mapping[str, object]) -> StoreOptions:
        """These options with the given fields replaced (e.g. from a connection's botocore
        ``config_kwargs``: ``connect_timeout``, ``read_timeout``, ``max_pool_connections``)."""
        names = {"max_pool_connections": "max_pool"}
        fields = {names.get(k, k): v for k, v in values.items()
                  if names.get(k, k) in ("connect_timeout", "read_timeout", "max_pool")}
        return replace(self, **fields) if fields else self  # type: ignore[arg-type]


def _flag(text: str, var: str) -> bool:
    value = text.strip().lower()
    if value in _YES:
        return True
    if value in _NO or not value:
        return False
    raise InvalidUsageError(f"{var}={text[:100]!r} must be one of {', '.join(_YES + _NO)}", value=text[:100])


def _seconds(text: str, var: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidUsageError(f"{var}={text!r} is not a number of seconds", value=text) from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidUsageError(f"{var}={text!r} must be a positive, finite number of seconds", value=text)
    return value
