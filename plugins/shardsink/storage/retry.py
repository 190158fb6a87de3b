"""Named, bounded, jittered retry policies (tenacity), with injectable sleep; the retrying
blob every store from :func:`shardsink.storage.url.open_blob` is wrapped in.

Which requests may be retried blindly is decided here, in one place:

* reads, plain puts of fresh keys, and deletes are idempotent: retried on any
  transient failure, including an unknown outcome;
* conditional writes (``create`` / ``replace``) are retried only when the request
  definitely did not apply (:class:`StorageError` with ``retryable``). An unknown
  outcome goes up to the commit machine, which re-reads before deciding.

Every other retry in the package (the commit loop, Airflow's attempts, a view refresh
after lost races) is a named :class:`RetryPolicy` too: nothing else sleeps.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from shardsink.errors import StorageError, UnknownOutcomeError
from shardsink.storage.base import Blob, Fetched, ObjectInfo, SourceObject, SourceVersion

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
        """``fn()``, retried by this policy (tenacity: at most ``attempts`` tries within
        ``deadline`` seconds of the first, full-jitter exponential waits slept with ``sleep``)
        while what it raises passes ``retry_on``; the last error is raised as is.

        The first try runs directly: the tenacity loop is built only once a try failed
        retryably (most requests succeed at once, and building it cost more than a request
        to the in-memory store), and is handed that failure as its first attempt, so the
        tries, waits and deadline are the same as a loop built up front."""
        start = time.monotonic()
        try:
            return fn()
        except BaseException as e:  # what tenacity's loop would judge: retry_on decides
            if not retry_on(e):
                raise
            failed: list[BaseException] = [e]

        def attempt() -> T:
            if failed:
                raise failed.pop()
            return fn()

        return self._retrying(retry_on, self.deadline - (time.monotonic() - start))(attempt)

    def _retrying(self, retry_on: Callable[[BaseException], bool], deadline: float) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(deadline),
            wait=wait_random_exponential(multiplier=self.first_wait, max=self.max_wait),
            retry=retry_if_exception(retry_on),
            sleep=self.sleep,
            reraise=True,
        )

    def backoff(self, attempt: int) -> float:
        """The jittered wait before try ``attempt`` (>= 2), as :meth:`call` waits: uniform in
        ``[0, min(max_wait, first_wait * 2**(attempt - 2))]`` (full jitter, capped)."""
        return random.uniform(0, min(self.max_wait, self.first_wait * 2 ** max(0, attempt - 2)))

    def waits(self, *, clock: Callable[[], float] = time.monotonic) -> Iterator[float]:
        """The waits of a hand-written retry loop: at most ``attempts``, the i-th uniform in
        ``[0, min(max_wait, first_wait * 2**i)]`` (full jitter, as :meth:`call` waits), each
        cut to what is left of ``deadline`` counted from THIS call (not from the first wait);
        ends once the deadline is spent. The caller sleeps them (``self.sleep``). Time spent
        is the clock's, or the sum of the waits if larger (an injected sleep does not advance
        the clock)."""
        return self._waits(clock(), clock)

    def _waits(self, start: float, clock: Callable[[], float]) -> Iterator[float]:
        waited = 0.0
        for i in range(self.attempts):
            left = self.deadline - max(clock() - start, waited)
            if left <= 0:
                return
            wait = min(left, self.backoff(i + 2))
            waited += wait
            yield wait


#: Idempotent storage requests (GET, LIST, DELETE, PUT of a fresh unique key).
STORAGE = RetryPolicy("storage", attempts=6, first_wait=0.05, max_wait=2.0, deadline=60.0)
#: Re-reads and re-tries inside one compare-and-append after races or unknown outcomes.
COMMIT = RetryPolicy("commit", attempts=12, first_wait=0.02, max_wait=1.0, deadline=120.0)
#: Writes that only note something while another failure is handled (e.g. a source's health):
#: a few quick tries, then the caller gives up rather than hold up the failure it reports.
BEST_EFFORT = RetryPolicy("best_effort", attempts=3, first_wait=0.05, max_wait=0.5, deadline=5.0)


def transient(e: BaseException) -> bool:
    """Safe to retry an idempotent request after this failure."""
    if isinstance(e, StorageError):
        return e.retryable
    return isinstance(e, UnknownOutcomeError)


def not_applied(e: BaseException) -> bool:
    """Safe to retry a conditional write after this failure: it definitely did not apply."""
    return isinstance(e, StorageError) and e.retryable


def key_class(key: str) -> str:
    """What requests are counted by: the key's folder, at most two segments deep
    (``state/v``, ``state/rollup``, ``state`` for ``state/LATEST.json``, ``parts/<desc_id>``)."""
    last = key.rfind("/")
    if last < 0:
        return ""
    first = key.find("/")
    second = key.find("/", first + 1, last)
    return key[:last] if second < 0 else key[:second]


class RequestCounter:
    """Requests sent to a backend, every attempt counted (a retried GET counts twice):
    ``total`` and ``by_kind[(method, key_class(key))]``. A LIST counts once, however many
    pages it reads, under its prefix (``state/v/`` is ``state/v``); a multi-object delete
    once per call, under its first key. Subclass :meth:`count` to observe
    each request as it is sent (benchmarks do)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_kind: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()  # fetch_many sends GETs from a thread pool

    def count(self, method: str, key: str) -> None:
        kind = (method, key_class(key))  # outside the lock: pure
        by_kind = self.by_kind
        with self._lock:
            self.total += 1
            by_kind[kind] = by_kind.get(kind, 0) + 1  # Counter's += without its __missing__ call


class RetryingBlob:
    """Wraps a backend with the retry policy suited to each request kind, and counts requests.

    Wrapping is idempotent: a :class:`RetryingBlob` of a :class:`RetryingBlob` wraps the same
    backend (with the new policy) and shares its counter, so requests are never retried by
    two layers and every handle on the store sees one count.
    """

    def __init__(self, inner: Blob, *, policy: RetryPolicy | None = None) -> None:
        """``policy``: the idempotent requests' policy; None keeps the wrapped
        :class:`RetryingBlob`'s own (e.g. ``StoreOptions.retry``), else :data:`STORAGE`."""
        counter: RequestCounter = RequestCounter()
        if isinstance(inner, RetryingBlob):
            counter = inner.counter
            policy = policy if policy is not None else inner.policy
            inner = inner.inner
        self.inner: Blob = inner
        self.url = inner.url
        self.policy: RetryPolicy = policy if policy is not None else STORAGE
        #: Public: benchmarks and tests read ``requests`` / ``requests_by_kind``, or set their own counter.
        self.counter: RequestCounter = counter

    @property
    def requests(self) -> int:
        """Requests sent so far (attempts, retries included)."""
        return self.counter.total

    @property
    def requests_by_kind(self) -> Counter[tuple[str, str]]:
        """Requests sent so far by ``(method, key_class(key))``."""
        return self.counter.by_kind

    def _call(self, method: str, key: str, fn: Callable[[], T], retry_on: Callable[[BaseException], bool]) -> T:
        def attempt() -> T:
            self.counter.count(method, key)
            return fn()

        return self.policy.call(attempt, retry_on=retry_on)

    def get(self, key: str) -> Fetched | None:
        return self._call("get", key, lambda: self.inner.get(key), transient)

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, lambda: self.inner.put(key, data), transient)

    def create(self, key: str, data: bytes) -> str:
        return self._call("create", key, lambda: self.inner.create(key, data), not_applied)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        return self._call("replace", key, lambda: self.inner.replace(key, data, etag=etag), not_applied)

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key), transient)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Nothing for no keys; a plain DELETE for one (what single cleanups always sent)."""
        if len(keys) == 1:
            self.delete(keys[0])
        elif keys:
            self._call("delete_many", keys[0], lambda: self.inner.delete_many(keys), transient)

    def get_source(self, key: str) -> SourceObject | None:
        return self._call("get_source", key, lambda: self.inner.get_source(key), transient)

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        """A ranged read (counted as ``get_range``); a changed object (ConditionFailedError) is not retried."""
        return self._call("get_range", key, lambda: self.inner.get_source_range(key, start, end, expect=expect),
                          transient)

    def clock(self) -> float:
        """The store's clock (:meth:`shardsink.storage.base.Blob.clock`), counted as ``clock``."""
        return self._call("clock", "", self.inner.clock, transient)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter(self._call("list", prefix, lambda: list(self.inner.list(prefix)), transient))
