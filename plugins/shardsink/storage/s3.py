"""S3 backend (``s3://bucket/prefix/shard``), for AWS S3, MinIO and any S3-compatible store.

Endpoint and credentials come from the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, profiles, instance roles), or from an explicit :class:`S3Access`
(a boto3 session + endpoint, e.g. resolved from an Airflow connection) passed to
:func:`make_client` or made the default for a block of code with :func:`using_s3_access`
(a context variable: the process environment is never changed). Nothing is stored by
shardsink. Timeouts and the connection pool are :class:`~shardsink.storage.options.StoreOptions`:
given explicitly, else the access's, else from the environment (:func:`store_options`).

The conditional create is ``PutObject`` with ``If-None-Match: *``; the conditional
replace is ``PutObject`` with ``If-Match: <etag>``. Answers are classified as in
docs/architecture.md ("Commit"): 412 = lost race (definite), 409 / timeout / 5xx after
sending = unknown outcome, connection refused = definitely not applied.

Before its first write (any PUT or DELETE), a store proves it honours both headers: the
conditional-write probe of :mod:`shardsink.storage.probe`, once per process and endpoint. A
store that fails it refuses every write with :class:`~shardsink.errors.UnsafeStoreError`;
reads are not affected. ``StoreOptions.trust_conditional_writes`` skips it (logged loudly).

SUBTLE: botocore's own retries are switched off. A retried conditional put whose first
attempt landed but whose answer was lost comes back 412, which would make a writer
believe it lost a race it actually won. Retries happen above this layer, by policies
that know which requests are idempotent.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from shardsink.errors import ConditionFailedError, InvalidConfigurationError, StorageError, UnknownOutcomeError
from shardsink.storage.base import Fetched, ObjectInfo, SourceObject, SourceVersion, check_key, check_source_key
from shardsink.storage.options import TRUST_ENV, StoreOptions
from shardsink.storage.probe import PROBE_KEY, check_conditional_writes

# Errors raised before a request could reach the server: definitely not applied.
_NOT_SENT = (bexc.EndpointConnectionError, bexc.ConnectTimeoutError, bexc.NoCredentialsError)
# Errors after the request may have been sent: outcome unknown.
_IN_FLIGHT = (
    bexc.ReadTimeoutError,
    bexc.ConnectionClosedError,
    bexc.ResponseStreamingError,
    bexc.IncompleteReadError,
)
log = logging.getLogger(__name__)
_NOT_RETRYABLE_CODES = {"AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


@dataclass(frozen=True)
class S3Access:
    """Explicit S3 access: a boto3 session (credentials, region), an optional endpoint and
    optional store options (None: from the environment).

    ``repr`` shows no secret: the session object holds them and never prints them.
    """

    session: Any = field(repr=False)
    endpoint_url: str | None = None
    options: StoreOptions | None = None


_ACCESS: ContextVar[S3Access | None] = ContextVar("shardsink_s3_access", default=None)


@contextmanager
def using_s3_access(access: S3Access | None) -> Iterator[None]:
    """Make ``access`` the default of every S3 client created in this block (this thread/task).

    SUBTLE: a context variable, not the environment: concurrent tasks in one worker do
    not see each other's credentials, and nothing leaks into child processes. Blobs
    keep the client they were built with, so build them inside the block.
    """
    token = _ACCESS.set(access)
    try:
        yield
    finally:
        _ACCESS.reset(token)


def store_options(options: StoreOptions | None = None, access: S3Access | None = None) -> StoreOptions:
    """``options``, else those of ``access`` (default: the one set by :func:`using_s3_access`),
    else the environment's."""
    access = access or _ACCESS.get()
    return options or (access.options if access is not None else None) or StoreOptions.from_env()


def current_access() -> S3Access:
    """The access an S3 client made now would use, resolved: the one set by
    :func:`using_s3_access`, else the standard AWS environment (session, endpoint, options).

    For engines that reach S3 without boto3 (pyarrow's filesystem, Polars): they get the
    same credentials and endpoint as the store. Its session holds secrets: never log it.
    """
    access = _ACCESS.get()
    endpoint = checked_endpoint(None, access)
    session = access.session if access is not None else _session(*(os.environ.get(k) for k in _SESSION_ENV))
    return S3Access(session=session, endpoint_url=endpoint, options=store_options(None, access))


#: Where an endpoint comes from, in botocore's order (the service's variable over the global one).
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def checked_endpoint(endpoint_url: str | None, access: S3Access | None) -> str | None:
    """The endpoint a client uses: ``endpoint_url``, else the access's, else the first of
    :data:`_ENDPOINT_ENV` that is set; None: AWS's own. InvalidConfigurationError names the
    setting when it is not an ``http(s)://host[:port]`` URL.

    SUBTLE: a variable set to the empty string is set (botocore reads it and fails with a bare
    ``ValueError: Invalid endpoint:``), so it is refused here, naming it, not skipped."""
    if endpoint_url is not None:
        return _endpoint(endpoint_url, "endpoint_url")
    if access is not None and access.endpoint_url is not None:
        return _endpoint(access.endpoint_url, "the endpoint_url of the store's access (its connection)")
    for var in _ENDPOINT_ENV:
        if var in os.environ:
            return _endpoint(os.environ[var], var)
    return None


def _endpoint(url: str, what: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # a port out of range or not a number
        ok = False
    if not ok:
        raise InvalidConfigurationError(
            f"{what}={url!r:.200} is not an S3 endpoint URL (http(s)://host[:port], e.g. http://127.0.0.1:9000); "
            f"{'unset it to use AWS S3' if what.startswith('AWS_') else 'fix it'}", value=url[:200])
    return url


def make_client(endpoint_url: str | None = None, *, access: S3Access | None = None,
                options: StoreOptions | None = None) -> Any:
    """A boto3 S3 client with botocore retries off and bounded timeouts.

    Credentials and endpoint: ``access``, else the one set by :func:`using_s3_access`,
    else the standard AWS environment (a bad endpoint: :func:`checked_endpoint`). Timeouts and
    pool: ``options``, else the access's, else :meth:`StoreOptions.from_env`.
    """
    access = access or _ACCESS.get()
    endpoint = checked_endpoint(endpoint_url, access)
    opts = store_options(options, access)
    config = Config(
        retries={"total_max_attempts": 1},
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.read_timeout,
        s3={"addressing_style": "path" if endpoint else "auto"},
        max_pool_connections=opts.max_pool,
    )
    session = access.session if access is not None else _session(*(os.environ.get(k) for k in _SESSION_ENV))
    return session.client("s3", endpoint_url=endpoint, config=config)


_SESSION_ENV = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")


@functools.lru_cache(maxsize=8)
def _session(*env: str | None) -> Any:
    # Building a Session loads service models (~0.3 s of CPU); reuse it while the
    # credential-relevant environment is unchanged. Arguments are only the cache key.
    return boto3.session.Session()


_DELETE_BATCH = 1000  # S3's DeleteObjects limit


def _status(e: bexc.ClientError) -> tuple[int, str]:
    meta = e.response.get("ResponseMetadata", {})
    return int(meta.get("HTTPStatusCode", 0)), str(e.response.get("Error", {}).get("Code", ""))


class S3Blob:
    """Blob store under ``s3://bucket/prefix/``; see the module docstring."""

    def __init__(self, bucket: str, prefix: str, *, client: Any | None = None,
                 options: StoreOptions | None = None) -> None:
        """``options``: only ``trust_conditional_writes`` is read here (None: :func:`store_options`);
        the client's timeouts are ``client``'s own."""
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"
        self.client = client if client is not None else make_client(options=options)
        self.requests = 0
        self.client.meta.events.register("before-send.s3", self._count)
        #: Whether writes skip the conditional-write probe (:mod:`shardsink.storage.probe`).
        self.trusted = store_options(options).trust_conditional_writes
        if self.trusted:
            log.warning("CONDITIONAL-WRITE PROBE SKIPPED for %s at %s (%s is set): shardsink cannot tell whether "
                        "this store honours If-None-Match and If-Match; if it does not, concurrent writers can "
                        "silently lose batches. Only for a store verified by other means (docs/deployment.md).",
                        self.url, self.client.meta.endpoint_url, TRUST_ENV)

    def _count(self, request: Any = None, **_: Any) -> None:
        # The probe's own requests are the probe's (probe.Verdict.requests), not this store's.
        if request is None or f"/{PROBE_KEY}" not in str(getattr(request, "url", "")):
            self.requests += 1

    def _check_writable(self) -> None:
        """Every write passes here first: UnsafeStoreError if the store failed the probe
        (probed on the first write of this process to the endpoint), else nothing."""
        if not self.trusted:
            check_conditional_writes(self.client, self.bucket)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}" if self.prefix else check_key(key)

    def _fail(self, e: Exception, what: str, *, write: bool) -> Exception:
        """Map a botocore failure to the error class that says what the caller must do."""
        where = f"{what} on {self.url}"
        if isinstance(e, bexc.ClientError):
            status, code = _status(e)
            if status == 412 or code == "PreconditionFailed":
                return ConditionFailedError(f"{where}: precondition failed (412)")
            if status == 409 or status >= 500 or status == 0:
                if write:
                    return UnknownOutcomeError(f"{where}: {status} {code}; the write may have been applied")
                return StorageError(f"{where}: {status} {code}")
            if code in ("SlowDown", "RequestTimeout", "Throttling") or status == 429:
                return StorageError(f"{where}: {status} {code}")
            return StorageError(f"{where}: {status} {code}: {e}", retryable=code not in _NOT_RETRYABLE_CODES)
        if isinstance(e, _NOT_SENT):
            return StorageError(f"{where}: {type(e).__name__}: {e}")
        if isinstance(e, (*_IN_FLIGHT, bexc.BotoCoreError)):
            if write:
                return UnknownOutcomeError(f"{where}: {type(e).__name__}; the write may have been applied")
            return StorageError(f"{where}: {type(e).__name__}: {e}")
        return e

    def get(self, key: str) -> Fetched | None:
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return Fetched(r["Body"].read(), r["ETag"])
        except bexc.ClientError as e:
            status, code = _status(e)
            if status == 404 or code in ("NoSuchKey", "404"):
                if code == "NoSuchBucket":
                    raise StorageError(f"no such bucket {self.bucket!r} for {self.url}", retryable=False) from e
                return None
            raise self._fail(e, f"GET {key}", write=False) from e
        except Exception as e:
            raise self._fail(e, f"GET {key}", write=False) from e

    def get_source(self, key: str) -> SourceObject | None:
        k = check_source_key(key)
        full = f"{self.prefix}/{k}" if self.prefix else k
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=full)
            return SourceObject(r["Body"].read(), str(r["ETag"]))
        except bexc.ClientError as e:
            status, code = _status(e)
            if status == 404 and code != "NoSuchBucket":
                return None
            raise self._fail(e, f"GET {key!r}", write=False) from e
        except Exception as e:
            raise self._fail(e, f"GET {key!r}", write=False) from e

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        """A ranged GET (``If-Match`` the listed ETag when known; the object's total size checked):
        ConditionFailedError if the object is no longer the one listed."""
        k = check_source_key(key)
        full = f"{self.prefix}/{k}" if self.prefix else k
        if end <= start:
            return b""
        cond = {"IfMatch": expect.identity} if expect.identity else {}
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=full, Range=f"bytes={start}-{end - 1}", **cond)
            total = str(r.get("ContentRange", "")).rpartition("/")[2]
            if total.isdigit() and int(total) != expect.size:
                raise ConditionFailedError(f"GET {key!r} on {self.url}: {total} bytes, listed as {expect.size}")
            return bytes(r["Body"].read())
        except bexc.ClientError as e:
            status, code = _status(e)
            if status == 404 and code != "NoSuchBucket":
                return None
            if status == 416:
                return b""
            raise self._fail(e, f"GET {key!r} (range)", write=False) from e
        except ConditionFailedError:
            raise
        except Exception as e:
            raise self._fail(e, f"GET {key!r} (range)", write=False) from e

    def _put(self, key: str, data: bytes, what: str, **cond: str) -> str:
        self._check_writable()
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **cond)
            return str(r["ETag"])
        except bexc.ClientError as e:
            if "IfMatch" in cond and _status(e) == (404, "NoSuchKey"):
                # If-Match on a missing object: S3 answers 404, the contract says lost condition.
                raise ConditionFailedError(f"{what} {key} on {self.url}: the object does not exist") from e
            raise self._fail(e, f"{what} {key}", write=True) from e
        except Exception as e:
            raise self._fail(e, f"{what} {key}", write=True) from e

    def put(self, key: str, data: bytes) -> str:
        return self._put(key, data, "PUT")

    def create(self, key: str, data: bytes) -> str:
        return self._put(key, data, "PUT If-None-Match", IfNoneMatch="*")

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        if etag is None:
            return self.create(key, data)
        return self._put(key, data, "PUT If-Match", IfMatch=etag)

    def delete(self, key: str) -> None:
        self._check_writable()
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            raise self._fail(e, f"DELETE {key}", write=True) from e

    def delete_many(self, keys: Sequence[str]) -> None:
        """DeleteObjects, 1,000 keys a request (S3's limit), quiet mode: only failures come back."""
        self._check_writable()
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[i:i + _DELETE_BATCH]
            what = f"DELETE {len(chunk)} objects ({chunk[0]} ...)"
            try:
                r = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": self._key(k)} for k in chunk], "Quiet": True})
            except Exception as e:
                raise self._fail(e, what, write=True) from e
            errors = r.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(f"{what} on {self.url}: {len(errors)} not deleted, e.g. {first.get('Key')}: "
                                   f"{first.get('Code')} {first.get('Message', '')}".rstrip())

    def clock(self) -> float:
        """The store's ``Date`` (whole seconds) on a one-key LIST of this prefix, less one second:
        S3 rounds LastModified to whole seconds too (``Blob.clock``). This host's clock less one
        second if the response carries no Date."""
        try:
            r = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except Exception as e:
            raise self._fail(e, "LIST (the store's clock)", write=False) from e
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            return parsedate_to_datetime(date).timestamp() - 1.0 if date else time.time() - 1.0
        except (TypeError, ValueError):
            return time.time() - 1.0

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix.strip("/"):
            check_key(prefix.rstrip("/"))  # same refusal as every other key (and LocalBlob.list)
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(obj["Key"][strip:], int(obj["Size"]), obj["LastModified"].timestamp(),
                                     str(obj.get("ETag", "")))
        except Exception as e:
            raise self._fail(e, f"LIST {prefix}", write=False) from e
