"""The simulated world's object store: S3's semantics in memory, on a simulated clock.

:class:`World` holds every bucket's objects and the :class:`SimClock`; :class:`MemBlob` is one
backend rooted at ``bucket/prefix`` (a :class:`shardsink.storage.base.Blob`), what
:func:`shardsink.storage.url.open_blob` hands the library for ``s3://<bucket>/...`` while a
world is served (:func:`World.serving`). The semantics the protocol relies on, as S3 gives them:

* ``create`` is ``PUT If-None-Match: *`` (exactly one creator wins; the others get 412,
  :class:`~shardsink.errors.ConditionFailedError`); ``replace`` is ``PUT If-Match`` (412, also on a
  missing object); ``put`` and ``delete`` are plain; ``delete_many`` is quiet;
* strong read-after-write and list-after-write: every request sees every write before it;
* an ETag is the quoted MD5 of the bytes (equal bytes, equal ETag: a restored file's identity
  comes back) and a listing carries it; ``LastModified`` is whole seconds (the clock truncated);
  :meth:`MemBlob.clock` is a request's ``Date`` (whole seconds) less one second, as
  :meth:`shardsink.storage.s3.S3Blob.clock` reads it.

Every request first passes the world's ``gate`` (:class:`Gate`): the scheduler's baton, crash
points and injected faults (:mod:`shardsink_dev.sim.sched`). Performed requests are reported to
the world's ``observers`` (the invariant checker) in the order they took effect.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from shardsink.errors import ConditionFailedError, StorageError, UnknownOutcomeError
from shardsink.storage.base import (
    Fetched,
    ObjectInfo,
    SourceObject,
    SourceVersion,
    check_key,
    check_source_key,
)

#: How a request ends (persist's four outcomes): done; refused, not performed; timed out and not
#: performed; performed but reported as timed out.
Outcome = Literal["ok", "failed", "lost", "performed"]
Method = Literal["get", "get_source", "get_range", "list", "clock", "put", "create", "replace", "delete",
                 "delete_many"]
WRITES: frozenset[str] = frozenset({"put", "create", "replace", "delete", "delete_many"})


class SimClock:
    """Simulated epoch seconds: only :meth:`advance` moves it (sleeps, ticks, the scheduler)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        """Now, in epoch seconds (what the library is given wherever it takes a clock)."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0)."""
        if seconds > 0:
            self.now += seconds


@dataclass
class Obj:
    """One stored object: bytes, ETag and whole-second ``LastModified``."""

    data: bytes
    etag: str
    modified: float
    #: Its :class:`ObjectInfo` as last listed, with the length of the root prefix it was listed
    #: under (an object never changes: a write makes a new one; ObjectInfo is immutable).
    listed: tuple[int, ObjectInfo] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Event:
    """A performed write, as observers see it: ``before`` and ``after`` (None: absent)."""

    method: str
    bucket: str
    key: str
    before: Obj | None
    after: Obj | None


class Gate(Protocol):
    """What a request passes before it is performed: the scheduler (:mod:`shardsink_dev.sim.sched`)."""

    def request(self, method: str, where: str) -> Outcome:
        """Hand the baton over (or not), maybe crash the caller; then how this request ends."""
        ...


class OpenGate:
    """A gate that lets every request through at once (set-up and the final checks)."""

    def request(self, method: str, where: str) -> Outcome:
        return "ok"


def etag_of(data: bytes) -> str:
    """S3's ETag of a single-part upload: the quoted MD5 of the bytes."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


@dataclass
class World:
    """Every bucket's objects, the clock, the gate requests pass, and the observers of writes."""

    clock: SimClock
    gate: Gate = field(default_factory=OpenGate)
    buckets: dict[str, dict[str, Obj]] = field(default_factory=dict)
    observers: list[Callable[[Event], None]] = field(default_factory=list)
    #: Every bucket's keys, sorted (kept by :meth:`write`): a listing is a bisected range of them.
    sorted_keys: dict[str, list[str]] = field(default_factory=dict)

    def objects(self, bucket: str) -> dict[str, Obj]:
        """The objects of ``bucket`` by full key (created empty on first use)."""
        return self.buckets.setdefault(bucket, {})

    def listing(self, bucket: str, prefix: str) -> list[tuple[str, Obj]]:
        """The objects of ``bucket`` whose key starts with ``prefix``, sorted by key."""
        keys, objs = self.sorted_keys.get(bucket, []), self.objects(bucket)
        out = []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            k = keys[i]
            if not k.startswith(prefix):
                break
            out.append((k, objs[k]))
        return out

    def stamp(self) -> float:
        """``LastModified`` of a write now: whole seconds."""
        return float(int(self.clock.now))

    def write(self, method: str, bucket: str, key: str, data: bytes | None) -> Obj | None:
        """Perform a write (``data`` None: a delete), tell the observers, return the new object."""
        objs = self.objects(bucket)
        before = objs.get(key)
        after = None if data is None else Obj(data, etag_of(data), self.stamp())
        keys = self.sorted_keys.setdefault(bucket, [])
        if after is None:
            if objs.pop(key, None) is not None:
                del keys[bisect.bisect_left(keys, key)]
        else:
            if before is None:
                bisect.insort(keys, key)
            objs[key] = after
        if before is not None or after is not None:
            ev = Event(method, bucket, key, before, after)
            for o in self.observers:
                o(ev)
        return after


class MemBlob:
    """A backend rooted at ``bucket/prefix`` of a :class:`World` (see the module docstring).

    Every request asks the world's gate first; an outcome other than ``ok`` raises what the S3
    backend raises for it: a read that fails or times out is a retryable StorageError; a write
    refused is a retryable StorageError, one timed out is an UnknownOutcomeError (``performed``:
    after performing it; a multi-object delete then performs some of its keys only)."""

    def __init__(self, world: World, bucket: str, prefix: str) -> None:
        self.world, self.bucket, self.prefix = world, bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"

    # --- plumbing ---------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _enter(self, method: Method, key: str) -> Outcome:
        """The gate's verdict; raises for the outcomes that perform nothing."""
        out = self.world.gate.request(method, f"{self.url}/{key}")
        if out == "ok":
            return out
        where = f"{method.upper()} {key} on {self.url} (simulated)"
        if out == "failed":
            raise StorageError(f"{where}: 503 SlowDown")
        if out == "lost" and method in WRITES:
            raise UnknownOutcomeError(f"{where}: timed out; the write may have been applied")
        if out in ("lost", "performed") and method not in WRITES:
            raise StorageError(f"{where}: read timed out")
        return out

    def _after(self, out: Outcome, method: str, key: str) -> None:
        if out == "performed":
            raise UnknownOutcomeError(f"{method.upper()} {key} on {self.url} (simulated): timed out after it was "
                                      "applied; the write may have been applied")

    def _objs(self) -> dict[str, Obj]:
        return self.world.objects(self.bucket)

    # --- reads ------------------------------------------------------------------------------

    def get(self, key: str) -> Fetched | None:
        self._enter("get", check_key(key))
        o = self._objs().get(self._full(key))
        return None if o is None else Fetched(o.data, o.etag)

    def get_source(self, key: str) -> SourceObject | None:
        self._enter("get_source", check_source_key(key))
        o = self._objs().get(self._full(key))
        return None if o is None else SourceObject(o.data, o.etag)

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        """A ranged GET, ``If-Match`` the listed ETag when known, the total size checked."""
        self._enter("get_range", check_source_key(key))
        o = self._objs().get(self._full(key))
        if o is None:
            return None
        if (expect.identity and o.etag != expect.identity) or len(o.data) != expect.size:
            raise ConditionFailedError(f"GET {key!r} on {self.url}: not the object listed")
        return b"" if end <= start else o.data[start:end]

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix.strip("/"):
            check_key(prefix.rstrip("/"))
        self._enter("list", prefix)
        full = self._full(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        found = self.world.listing(self.bucket, full)
        out = []
        for k, o in found:
            c = o.listed
            if c is None or c[0] != strip:
                c = o.listed = (strip, ObjectInfo(k[strip:], len(o.data), o.modified, o.etag))
            out.append(c[1])
        return iter(out)

    def clock(self) -> float:
        """A request's ``Date`` (whole seconds) less one second."""
        self._enter("clock", "")
        return float(int(self.world.clock.now)) - 1.0

    # --- writes -----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> str:
        out = self._enter("put", check_key(key))
        o = self.world.write("put", self.bucket, self._full(key), bytes(data))
        self._after(out, "put", key)
        assert o is not None
        return o.etag

    def create(self, key: str, data: bytes) -> str:
        out = self._enter("create", check_key(key))
        if self._full(key) in self._objs():
            raise ConditionFailedError(f"PUT If-None-Match {key} on {self.url}: precondition failed (412)")
        o = self.world.write("create", self.bucket, self._full(key), bytes(data))
        self._after(out, "create", key)
        assert o is not None
        return o.etag

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        if etag is None:
            return self.create(key, data)
        out = self._enter("replace", check_key(key))
        cur = self._objs().get(self._full(key))
        if cur is None or cur.etag != etag:
            raise ConditionFailedError(f"PUT If-Match {key} on {self.url}: precondition failed (412)")
        o = self.world.write("replace", self.bucket, self._full(key), bytes(data))
        self._after(out, "replace", key)
        assert o is not None
        return o.etag

    def delete(self, key: str) -> None:
        out = self._enter("delete", check_key(key))
        self.world.write("delete", self.bucket, self._full(key), None)
        self._after(out, "delete", key)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Quiet multi-object delete; a ``performed`` timeout has deleted only every other key."""
        if not keys:
            return
        out = self._enter("delete_many", check_key(keys[0]))
        for i, k in enumerate(keys):
            if out != "performed" or i % 2 == 0:
                self.world.write("delete", self.bucket, self._full(check_key(k)), None)
        self._after(out, "delete_many", keys[0])
