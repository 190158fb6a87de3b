"""The blob interface every backend implements, and key validation.

A backend is rooted at one shard: keys are relative, ``/``-separated, and never
contain ``..`` or empty segments, so no key can leave the shard's root.

Contract of the two conditional writes, the only primitives the commit protocol needs:

* ``create(key, data)`` succeeds iff no object existed at ``key``; exactly one of any
  number of concurrent creators wins, the others get :class:`ConditionFailedError`.
* ``replace(key, data, etag=E)`` succeeds iff the object's current etag is ``E``
  (``E is None``: iff it does not exist).

Both raise :class:`UnknownOutcomeError` when the request may have been applied but no
answer came back, and :class:`StorageError` when it definitely was not applied.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from shardsink.errors import InvalidUsageError

_SEGMENT = re.compile(r"^[A-Za-z0-9._=+-]+$")


@dataclass(frozen=True)
class Fetched:
    data: bytes
    etag: str


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch


class Blob(Protocol):
    """A shard's object store: immutable objects plus two conditional writes."""

    url: str

    def get(self, key: str) -> Fetched | None: ...

    def put(self, key: str, data: bytes) -> str: ...

    def create(self, key: str, data: bytes) -> str: ...

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str: ...

    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete every key (a missing one is fine): one request per up to 1,000 keys where the
        store has a multi-object delete. In no particular order; after a failure any subset
        may be gone."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...


def check_key(key: str) -> str:
    """Return ``key`` if it stays inside the shard root, else raise InvalidUsageError."""
    segments = key.split("/")
    for seg in segments:
        if seg in ("", ".", "..") or not _SEGMENT.match(seg):
            raise InvalidUsageError(
                f"invalid object key {key!r}: segment {seg!r} is not allowed "
                "(expected non-empty segments of letters, digits and ._=+- only)"
            )
    return key
