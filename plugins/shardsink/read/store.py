"""Where an engine finds a shard's parts: local paths, or S3 through pyarrow or object_store.

Both engines read S3 without downloading anything at run time (DuckDB would fetch its
``httpfs`` extension from the internet): DuckDB scans a ``pyarrow.dataset`` over
pyarrow's own S3 filesystem (:func:`arrow_filesystem`), Polars reads S3 natively
(:func:`polars_storage_options`). Both are configured like the shard's store
(:mod:`shardsink.storage.s3`): the :class:`~shardsink.storage.s3.S3Access` in effect (an
Airflow connection, :func:`~shardsink.storage.s3.using_s3_access`), else the standard AWS
environment (``AWS_ENDPOINT_URL[_S3]``, keys, profile, region), with the timeouts of
:class:`~shardsink.storage.options.StoreOptions`.

SUBTLE: credentials are resolved once, when the read is planned (frozen from the boto3
session); a read that outlives temporary credentials fails with an access error.
Secrets go only into the filesystem/options objects handed to the engine, never into a
message or a log line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from shardsink.core.state import PartMeta
from shardsink.storage import s3 as s3store
from shardsink.storage.url import ShardUrl, parse_url

#: Characters a DuckDB or Polars path argument would read as a glob pattern.
GLOB_CHARS = re.compile(r"[*?\[\]{}]")


@dataclass(frozen=True)
class S3Config:
    """Resolved S3 access for an engine (repr hides the secrets)."""

    endpoint: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None
    connect_timeout: float
    read_timeout: float

    def __repr__(self) -> str:
        return f"S3Config(endpoint={self.endpoint!r}, region={self.region!r}, credentials=<hidden>)"


def s3_config() -> S3Config:
    """The S3 access the store would use now (see the module docstring)."""
    access = s3store.current_access()  # what make_client would use: using_s3_access, else the environment
    endpoint, session = access.endpoint_url, access.session
    creds = session.get_credentials()
    frozen = creds.get_frozen_credentials() if creds is not None else None
    opts = access.options or s3store.store_options(None, access)
    return S3Config(
        endpoint=endpoint,
        region=session.region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        access_key=frozen.access_key if frozen else None,
        secret_key=frozen.secret_key if frozen else None,
        session_token=frozen.token if frozen else None,
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.read_timeout,
    )


def arrow_filesystem(cfg: S3Config) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem for ``cfg`` (path-style addressing under an endpoint override)."""
    kwargs: dict[str, Any] = {"connect_timeout": cfg.connect_timeout, "request_timeout": cfg.read_timeout}
    if cfg.access_key and cfg.secret_key:
        kwargs.update(access_key=cfg.access_key, secret_key=cfg.secret_key, session_token=cfg.session_token)
    if cfg.region:
        kwargs["region"] = cfg.region
    if cfg.endpoint:
        u = urlparse(cfg.endpoint)
        kwargs.update(endpoint_override=u.netloc + u.path.rstrip("/"), scheme=u.scheme or "https",
                      force_virtual_addressing=False)
    return pafs.S3FileSystem(**kwargs)


def polars_storage_options(cfg: S3Config) -> dict[str, str]:
    """Polars' (object_store's) options for ``cfg``: endpoint and region only. The credentials
    go through :func:`polars_scan_options`' provider, never into the options (a LazyFrame's
    ``serialize()`` writes its options out)."""
    out: dict[str, str] = {}
    if cfg.region:
        out["aws_region"] = cfg.region
    if cfg.endpoint:
        out["aws_endpoint_url"] = cfg.endpoint
        out["aws_virtual_hosted_style_request"] = "false"
        if cfg.endpoint.startswith("http://"):
            out["aws_allow_http"] = "true"
    return out


class PolarsCredentials:
    """A Polars credential provider holding ``cfg``'s credentials in memory only.

    SUBTLE: a serialised plan must never carry a secret: pickling this provider gives one that
    resolves the credentials afresh (:func:`s3_config`) where it is loaded; ``repr`` hides them.
    """

    def __init__(self, cfg: S3Config) -> None:
        self._cfg = cfg

    def __call__(self) -> tuple[dict[str, str], int | None]:
        cfg, out = self._cfg, dict[str, str]()
        if cfg.access_key and cfg.secret_key:
            out.update(aws_access_key_id=cfg.access_key, aws_secret_access_key=cfg.secret_key)
            if cfg.session_token:
                out["aws_session_token"] = cfg.session_token
        return out, None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _credentials_here, ()

    def __repr__(self) -> str:
        return "PolarsCredentials(<hidden>)"


def _credentials_here() -> PolarsCredentials:
    return PolarsCredentials(s3_config())


def polars_scan_options(cfg: S3Config) -> dict[str, Any]:
    """``scan_parquet``'s keyword arguments for S3 under ``cfg``: options without secrets and
    the credentials through a provider (:class:`PolarsCredentials`)."""
    return {"storage_options": polars_storage_options(cfg), "credential_provider": PolarsCredentials(cfg)}


@dataclass(frozen=True)
class Located:
    """A shard's parts as paths: ``local`` paths (file URLs) or ``bucket/key`` (S3)."""

    url: ShardUrl
    paths: tuple[str, ...]

    @property
    def s3(self) -> bool:
        return self.url.scheme == "s3"

    @property
    def globby(self) -> bool:
        """Whether a path has characters an engine's path argument reads as a pattern."""
        return any(GLOB_CHARS.search(p) for p in self.paths)

    def uris(self) -> tuple[str, ...]:
        """``s3://bucket/key`` URIs (S3) or the local paths."""
        return tuple(f"s3://{p}" for p in self.paths) if self.s3 else self.paths


def locate(url: str, parts: tuple[PartMeta, ...]) -> Located:
    """The location of each part of the shard at ``url``."""
    u = parse_url(url)
    if u.scheme == "file":
        return Located(u, tuple(os.path.join(u.path, p.key) for p in parts))
    return Located(u, tuple(f"{u.bucket}/{u.path}/{p.key}" for p in parts))
