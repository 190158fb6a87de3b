"""Named, bounded, jittered retry policies (tenacity), with injectable sleep.

Which requests may be retried blindly is decided here, in one place:

* reads, plain puts of fresh keys, and deletes are idempotent: retried on any
  transient failure, including an unknown outcome;
* conditional writes (``create`` / ``replace``) are retried only when the request
  definitely did not apply (:class:`StorageError` with ``retryable``). An unknown
  outcome goes up to the commit machine, which re-reads before deciding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from shardsink.errors import StorageError, UnknownOutcomeError
from shardsink.storage.base import Blob, Fetched, ObjectInfo, SourceObject

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """A bounded exponential backoff with full jitter."""

    name: str
    attempts: int
    first_wait: float
    max_wait: float
    deadline: float
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def with_sleep(self, sleep: Callable[[float], None]) -> RetryPolicy:
        return RetryPolicy(self.name, self.attempts, self.first_wait, self.max_wait, self.deadline, sleep)

    def call(self, fn: Callable[[], T], *, retry_on: Callable[[BaseException], bool]) -> T:
        r = Retrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.deadline),
            wait=wait_random_exponential(multiplier=self.first_wait, max=self.max_wait),
            retry=retry_if_exception(retry_on),
            sleep=self.sleep,
            reraise=True,
        )
        return r(fn)


#: Idempotent storage requests (GET, LIST, DELETE, PUT of a fresh unique key).
STORAGE = RetryPolicy("storage", attempts=6, first_wait=0.05, max_wait=2.0, deadline=60.0)
#: Re-reads and re-tries inside one compare-and-append after races or unknown outcomes.
COMMIT = RetryPolicy("commit", attempts=12, first_wait=0.02, max_wait=1.0, deadline=120.0)


def transient(e: BaseException) -> bool:
    """Safe to retry an idempotent request after this failure."""
    if isinstance(e, StorageError):
        return e.retryable
    return isinstance(e, UnknownOutcomeError)


def not_applied(e: BaseException) -> bool:
    """Safe to retry a conditional write after this failure: it definitely did not apply."""
    return isinstance(e, StorageError) and e.retryable


class RetryingBlob:
    """Wraps a backend with the retry policy suited to each request kind."""

    def __init__(self, inner: Blob, *, policy: RetryPolicy = STORAGE) -> None:
        self.inner = inner
        self.url = inner.url
        self.policy = policy

    def get(self, key: str) -> Fetched | None:
        return self.policy.call(lambda: self.inner.get(key), retry_on=transient)

    def put(self, key: str, data: bytes) -> str:
        return self.policy.call(lambda: self.inner.put(key, data), retry_on=transient)

    def create(self, key: str, data: bytes) -> str:
        return self.policy.call(lambda: self.inner.create(key, data), retry_on=not_applied)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        return self.policy.call(lambda: self.inner.replace(key, data, etag=etag), retry_on=not_applied)

    def delete(self, key: str) -> None:
        self.policy.call(lambda: self.inner.delete(key), retry_on=transient)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Nothing for no keys; a plain DELETE for one (what single cleanups always sent)."""
        if len(keys) == 1:
            self.delete(keys[0])
        elif keys:
            self.policy.call(lambda: self.inner.delete_many(keys), retry_on=transient)

    def get_source(self, key: str) -> SourceObject | None:
        return self.policy.call(lambda: self.inner.get_source(key), retry_on=transient)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter(self.policy.call(lambda: list(self.inner.list(prefix)), retry_on=transient))
