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
#: A whole key of such segments, none ``.`` or ``..``: one match instead of one per segment.
_VALID_KEY = re.compile(r"(?:(?!\.\.?/)[A-Za-z0-9._=+-]+/)*(?!\.\.?\Z)[A-Za-z0-9._=+-]+")
#: The characters a key may hold (with the slash): :func:`check_key`'s fast path.
_KEY_CHARS = re.compile(r"[A-Za-z0-9._=+/-]+")


@dataclass(frozen=True)
class Fetched:
    data: bytes
    etag: str


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch
    #: The object's identity (:attr:`SourceObject.identity`) if the listing gives it (the S3
    #: ETag); "" if only a read does (a local folder: the content's hash).
    identity: str = ""


@dataclass(frozen=True)
class SourceObject:
    """A source file's bytes and identity, read together.

    ``identity`` changes whenever the bytes change, and is the same again once the exact
    bytes are restored: the local content hash (:mod:`shardsink.storage.local`), or the S3
    ETag. An ETag comes back only for the same bytes uploaded the same way: a multipart
    upload's depends on its part size, and an SSE-KMS / SSE-C ETag is not derived from the bytes.
    ``legacy``: the identity in the form an older version of the store recorded ("" if none);
    a recorded identity matches if it equals either (:meth:`matches`).
    """

    data: bytes
    identity: str
    legacy: str = ""

    def matches(self, recorded: str) -> bool:
        """Whether ``recorded`` (non-empty, e.g. at binding) is this object's identity in either form."""
        return recorded in (self.identity, self.legacy) and bool(recorded)


@dataclass(frozen=True)
class SourceVersion:
    """A listed source object, as ranged reads check it: ``size``, ``modified`` (epoch seconds,
    checked where the listing's identity is "": a local folder) and ``identity`` (the S3 ETag)."""

    size: int
    modified: float
    identity: str = ""


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

    def clock(self) -> float:
        """Epoch seconds by the clock that stamps this store's modification times (``modified``
        of :meth:`list`), no later than now: an object written after this call is stamped at or
        after the time returned. (S3: the ``Date`` of a request, whole seconds, less one second
        for LastModified's own rounding; a local folder: this host's clock, less a tick of the
        file system's coarse clock.)"""
        ...

    def get_source(self, key: str) -> SourceObject | None:
        """Read a *source* object (a landed file) with its identity; None if it is missing.

        Source keys are whatever the store allows (spaces, unicode, ``%``, ``+``, ``#``):
        they are not shard keys and skip :func:`check_key`; only :func:`check_source_key`
        applies (what no store can hold, or what would leave the root)."""
        ...

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        """Bytes ``[start, end)`` of source object ``key`` (fewer at its end); None if it is missing.

        ``expect``: what the object was when it was listed; ConditionFailedError if it is no
        longer that object (a local file's size or mtime, an S3 object's ETag or size differ),
        so a read spread over many ranged requests never mixes two versions of a file."""
        ...


#: The longest S3 object key, in UTF-8 bytes.
S3_KEY_MAX_BYTES = 1024


def check_source_key(key: str) -> str:
    """``key`` if a store can hold it under the root: non-empty, no NUL, not absolute, no
    empty, ``.`` or ``..`` segment (a local folder would resolve those outside the file),
    at most 1,024 UTF-8 bytes (S3's limit); else InvalidUsageError naming it."""
    bad = ("empty" if not key else "contains NUL" if "\0" in key else "is absolute" if key.startswith("/")
           else "has an empty, '.' or '..' segment" if any(s in ("", ".", "..") for s in key.split("/"))
           else f"is over {S3_KEY_MAX_BYTES} UTF-8 bytes" if len(key.encode("utf-8", "surrogatepass"))
           > S3_KEY_MAX_BYTES else None)
    if bad is not None:
        raise InvalidUsageError(f"source key {key[:300]!r} cannot be read: it {bad}", value=key[:300])
    return key


def check_key(key: str) -> str:
    """Return ``key`` if it stays inside the shard root, else raise InvalidUsageError."""
    # Fast path (every request checks its key): allowed characters only, no empty segment and
    # no segment starting with a dot (so no '.' or '..' one) is valid; anything else is judged below.
    if _KEY_CHARS.fullmatch(key) and key[0] not in "./" and key[-1] != "/" and "//" not in key and "/." not in key:
        return key
    if _VALID_KEY.fullmatch(key):
        return key
    segments = key.split("/")
    for seg in segments:
        if seg in ("", ".", "..") or not _SEGMENT.match(seg):
            raise InvalidUsageError(
                f"invalid object key {key!r}: segment {seg!r} is not allowed "
                "(expected non-empty segments of letters, digits and ._=+- only)"
            )
    return key
