"""Shard URLs: ``file:///abs/path/name`` or ``s3://bucket/prefix/name``.

A bare or relative path is accepted where a human types it (the CLI) and becomes a
``file://`` URL. ``..`` segments are refused outright so that no URL can address a
folder outside the one it names. :func:`open_blob` is the store factory: every store it
opens retries.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

from shardsink.errors import InvalidUsageError
from shardsink.storage.base import Blob
from shardsink.storage.options import StoreOptions
from shardsink.storage.probe import RESERVED_SEGMENT
from shardsink.storage.retry import STORAGE, RetryingBlob

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

#: TESTS ONLY: stores served in this process instead of S3, by bucket (:func:`serve`); empty in production.
_SERVED: dict[str, Callable[[ShardUrl], RetryingBlob]] = {}


def serve(bucket: str, factory: Callable[[ShardUrl], RetryingBlob] | None) -> None:
    """TESTS ONLY (the simulator, :mod:`shardsink_dev.sim`): :func:`open_blob` of any
    ``s3://<bucket>/...`` URL returns ``factory(url)`` instead of an S3 client; None stops it."""
    if factory is None:
        _SERVED.pop(bucket, None)
    else:
        _SERVED[bucket] = factory


@dataclass(frozen=True)
class ShardUrl:
    scheme: Literal["file", "s3"]
    bucket: str  # empty for file
    path: str  # absolute folder for file; key prefix for s3

    def __str__(self) -> str:
        if self.scheme == "file":
            return Path(self.path).as_uri()
        return f"s3://{self.bucket}/{self.path}"


def _refuse_dotdot(url: str, path: str, *, allow_dot: bool = False) -> None:
    refused = ("..",) if allow_dot else ("..", ".")
    if any(seg in refused for seg in path.split("/")):
        raise InvalidUsageError(f"shard URL {url!r} contains a '..' or '.' segment; expected a plain path")


def parse_url(url: str) -> ShardUrl:
    """Parse and validate a shard URL, raising InvalidUsageError naming what is wrong."""
    if isinstance(url, str) and "://" in url:
        return _parse_full(url)  # no relative path: a pure function of the text
    return _parse(url)


@functools.lru_cache(maxsize=256)
def _parse_full(url: str) -> ShardUrl:
    return _parse(url)


def _parse(url: str) -> ShardUrl:
    if not isinstance(url, str):
        raise InvalidUsageError(f"shard URL {url!r} is not a string; expected file:///abs/path/name or "
                                "s3://bucket/prefix/name")
    if not url:
        raise InvalidUsageError("empty shard URL; expected file:///abs/path/name or s3://bucket/prefix/name")
    if "://" not in url:
        # A typed relative path may say ./x; '..' is still refused (it could leave the root).
        _refuse_dotdot(url, url, allow_dot=True)
        return ShardUrl("file", "", os.path.abspath(url))
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidUsageError(f"shard URL {url!r} has host {parsed.netloc!r}; expected file:///abs/path")
        path = unquote(parsed.path)
        _refuse_dotdot(url, path)
        if not path.startswith("/") or path.rstrip("/") == "":
            raise InvalidUsageError(f"shard URL {url!r} needs an absolute folder path")
        return ShardUrl("file", "", path.rstrip("/"))
    if parsed.scheme in ("s3", "s3a"):
        if not _BUCKET.match(parsed.netloc):
            raise InvalidUsageError(f"shard URL {url!r}: {parsed.netloc!r} is not a valid S3 bucket name")
        prefix = parsed.path.strip("/")
        _refuse_dotdot(url, prefix)
        if not prefix:
            raise InvalidUsageError(f"shard URL {url!r} needs a prefix naming the shard (s3://bucket/name)")
        if "//" in prefix:
            raise InvalidUsageError(f"shard URL {url!r} has an empty path segment")
        if prefix.split("/")[0] == RESERVED_SEGMENT:
            raise InvalidUsageError(f"shard URL {url!r}: the folder {RESERVED_SEGMENT!r} at a bucket's root is "
                                    "reserved for shardsink's own objects (the conditional-write probe); "
                                    "expected another prefix")
        return ShardUrl("s3", parsed.netloc, prefix)
    raise InvalidUsageError(f"shard URL {url!r} has scheme {parsed.scheme!r}; expected file:// or s3://")


def open_blob(url: str | ShardUrl, options: StoreOptions | None = None) -> RetryingBlob:
    """The store of a shard URL, wrapped in its retry policy (imports boto3 only for s3 URLs).

    Every store the library opens comes from here, so every caller (commits, executors'
    part uploads, reclock documents, landing reads) retries idempotent requests the same
    way (:mod:`shardsink.storage.retry`). ``options``: see :mod:`shardsink.storage.options`.
    """
    u = url if isinstance(url, ShardUrl) else parse_url(url)
    if _SERVED and u.scheme == "s3" and u.bucket in _SERVED:
        return _SERVED[u.bucket](u)
    backend: Blob
    if u.scheme == "file":
        from shardsink.storage.local import LocalBlob

        backend, policy = LocalBlob(u.path), (options.retry if options is not None else STORAGE)
    else:
        from shardsink.storage.s3 import S3Blob, make_client, store_options

        opts = store_options(options)
        backend, policy = S3Blob(u.bucket, u.path, client=make_client(options=opts), options=opts), opts.retry
    return RetryingBlob(backend, policy=policy)
