"""The conditional-write probe: a store must prove it honours ``If-None-Match`` and ``If-Match``
before shardsink writes anything to it.

The commit protocol rests on two conditional puts (:mod:`shardsink.storage.base`). Some
S3-compatible servers accept the headers and ignore them (SeaweedFS #8800 answered 200 to
every one of several concurrent conditional creates; versitygw #1708 ignored them): there two
writers both "create" the same state version, both report success, and one batch is silently
lost. So before the first write through an S3 store, once per process and endpoint,
:func:`check_conditional_writes` sends at most 3 requests, all to :data:`PROBE_KEY` at the
root of the bucket being written:

1. ``PUT If-None-Match: *`` (any content). 412: the object existed and the create was refused,
   so ``If-None-Match`` is honoured; go to 3. 200: it was created (or the header was ignored).
2. only after a 200 in 1: the same ``PUT If-None-Match: *`` again; the object now exists, so it
   must be refused with 412. A 200 means the store ignores ``If-None-Match``.
3. ``PUT If-Match: <stale etag>`` (the MD5 of bytes never written there): must be refused
   (412; 404 if someone deleted the object meanwhile). A 200 means the store ignores ``If-Match``.

The verdict is cached per endpoint for the life of the process (:data:`_verdicts`): a safe
store costs nothing more; an unsafe one refuses every later write at once, without requests.
A store that ignores a header gets :class:`~shardsink.errors.UnsafeStoreError` naming the
endpoint and the header; reads are never probed and keep working.

SUBTLE: concurrent probes (threads or processes) are safe: the object's content never matters, a 412
in step 1 is evidence, never a failure, and nothing but a human deletes the object. A probe
request that fails (timeout, 5xx, access denied) is a :class:`~shardsink.errors.StorageError`
of the write that triggered it (which was not sent, so its retry policy may retry it, which
probes again); nothing is cached then. Access denied means the credentials may not write
:data:`PROBE_KEY` (IAM policies scoped to shard prefixes): grant ``s3:PutObject`` on it.

The opt-out (``StoreOptions(trust_conditional_writes=True)``, or the environment variable
``SHARDSINK_S3_TRUST_CONDITIONAL_WRITES=1``, see :mod:`shardsink.storage.options`) is for a
store the operator verified by other means; every store opened with it logs a WARNING.

The local folder backend is never probed: its conditional writes are the operating system's
(``link`` fails on an existing name; ``replace`` swaps under ``flock``), not a server's.

SUBTLE: no shard can contain :data:`PROBE_KEY`: shard URLs whose first path segment is
:data:`RESERVED_SEGMENT` are refused (:func:`shardsink.storage.url.parse_url`), so GC and verify,
which only list under a shard's root, never see, delete or report the probe object.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardsink.errors import StorageError, UnsafeStoreError

log = logging.getLogger(__name__)

#: The first path segment reserved for shardsink's own objects at a bucket's root.
RESERVED_SEGMENT = "_shardsink"
#: The one object the probe writes, at the root of each bucket it probes in.
PROBE_KEY = f"{RESERVED_SEGMENT}/probe/conditional-writes"
#: What the probe writes. Content never matters; it says what the object is to a human.
PROBE_BODY = (b"shardsink conditional-write probe (docs/deployment.md). Safe to keep; "
              b"content is never read. Deleting it only makes the next probe write it again.\n")
#: An ETag no object at PROBE_KEY can have: the MD5 of bytes never written there.
STALE_ETAG = '"' + hashlib.md5(b"shardsink probe: a stale etag", usedforsecurity=False).hexdigest() + '"'


@dataclass(frozen=True)
class Verdict:
    """A probe's result for one endpoint: ``ignored`` names the header the store ignored
    (None: both honoured), ``requests`` how many requests the probe sent."""

    endpoint: str
    bucket: str
    ignored: str | None
    requests: int
    #: Set when the store refused the header outright (501 NotImplemented) instead of ignoring it.
    unsupported: str = ""

    def error(self) -> UnsafeStoreError:
        what = (f"does not support the {self.ignored} header ({self.unsupported})" if self.unsupported else
                f"ignores the {self.ignored} header: a conditional write to s3://{self.bucket}/{PROBE_KEY} "
                "that had to be refused with 412 succeeded")
        return UnsafeStoreError(
            f"the S3 store at {self.endpoint} {what}. Concurrent writers "
            "could both commit the same state version and silently lose a batch, so shardsink refuses to "
            "write to this store (reads still work). Use a store that honours If-None-Match and If-Match, "
            "or, only if you verified it by other means, set SHARDSINK_S3_TRUST_CONDITIONAL_WRITES=1 "
            "(docs/runbooks/unsafe-store.md)", value=self.endpoint)


_lock = threading.Lock()
_endpoint_locks: dict[str, threading.Lock] = {}
#: Process-wide verdicts by endpoint URL. Tests may clear it (:func:`forget`).
_verdicts: dict[str, Verdict] = {}


def verdict(endpoint: str) -> Verdict | None:
    """The cached verdict of ``endpoint`` in this process, None if it was not probed yet."""
    with _lock:
        return _verdicts.get(endpoint)


def forget() -> None:
    """Drop every cached verdict (tests: probe again as a fresh process would)."""
    with _lock:
        _verdicts.clear()


def check_conditional_writes(client: Any, bucket: str) -> Verdict:
    """Raise :class:`UnsafeStoreError` unless the store behind ``client`` honours both
    conditional headers; probe it first (at most 3 requests, module docstring) unless this
    process already has its verdict. Raises :class:`StorageError` (nothing cached) when a
    probe request fails."""
    endpoint = str(client.meta.endpoint_url)
    with _lock:
        got = _verdicts.get(endpoint)
        per_endpoint = _endpoint_locks.setdefault(endpoint, threading.Lock())
    if got is None:
        with per_endpoint:  # one probe per endpoint at a time; the others wait for its verdict
            with _lock:
                got = _verdicts.get(endpoint)
            if got is None:
                got = _probe(client, endpoint, bucket)
                with _lock:
                    _verdicts[endpoint] = got
                _report(got)
    if got.ignored is not None:
        raise got.error()
    return got


def _report(v: Verdict) -> None:
    if v.ignored is None:
        log.info("conditional-write probe of %s (s3://%s/%s): If-None-Match and If-Match honoured (%d requests)",
                 v.endpoint, v.bucket, PROBE_KEY, v.requests)
    else:
        log.error("conditional-write probe of %s: the store IGNORES %s; writes to it are refused",
                  v.endpoint, v.ignored)


class _Unsupported(Exception):
    """The store answered 501 NotImplemented to a conditional header: it does not support it."""

    def __init__(self, header: str, answer: str) -> None:
        super().__init__(header, answer)
        self.header, self.answer = header, answer


def _probe(client: Any, endpoint: str, bucket: str) -> Verdict:
    sent = 0

    def put(**cond: str) -> int:
        """The status of a conditional PUT of the probe object: 200, 412 or 404."""
        nonlocal sent
        sent += 1
        return _conditional_put(lambda: client.put_object(Bucket=bucket, Key=PROBE_KEY, Body=PROBE_BODY, **cond),
                                endpoint, bucket, cond)

    try:
        created = put(IfNoneMatch="*") == 200
        if created and put(IfNoneMatch="*") == 200:
            return Verdict(endpoint, bucket, "If-None-Match", sent)
        if put(IfMatch=STALE_ETAG) == 200:
            return Verdict(endpoint, bucket, "If-Match", sent)
    except _Unsupported as e:
        return Verdict(endpoint, bucket, e.header, sent, unsupported=e.answer)
    return Verdict(endpoint, bucket, None, sent)


def _conditional_put(send: Callable[[], Any], endpoint: str, bucket: str, cond: dict[str, str]) -> int:
    header = "If-None-Match" if "IfNoneMatch" in cond else "If-Match"
    where = f"conditional-write probe (PUT {header}) of s3://{bucket}/{PROBE_KEY} at {endpoint}"
    import botocore.exceptions as bexc  # here: shard URLs parse (RESERVED_SEGMENT) without boto

    try:
        send()
        return 200
    except bexc.ClientError as e:
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        code = str(e.response.get("Error", {}).get("Code", ""))
        if status == 412 or code == "PreconditionFailed":
            return 412
        if header == "If-Match" and status == 404 and code != "NoSuchBucket":
            return 404  # the object vanished meanwhile: the condition was still evaluated
        if status == 501 or code == "NotImplemented":
            raise _Unsupported(header, f"{status} {code}") from e
        retryable = not (status in (401, 403) or code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId",
                                                          "SignatureDoesNotMatch"))
        hint = f"; the credentials must be allowed s3:PutObject on {PROBE_KEY}" if status == 403 else ""
        raise StorageError(f"{where}: {status} {code}{hint}", retryable=retryable) from e
    except (bexc.BotoCoreError, OSError) as e:
        raise StorageError(f"{where}: {type(e).__name__}: {e}") from e
