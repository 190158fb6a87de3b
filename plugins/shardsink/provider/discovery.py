"""Which shards the Shards page lists: the shard assets Airflow knows, plus configured URLs.

Runs inside the api-server (it reads Airflow's metadata DB and configuration). An asset
is a shard's when its URI is a shard URL (see :func:`shardsink.airflow.factory.shard_asset`:
the ingest, view and maintenance DAGs declare their shards that way) and a shard exists
there; a URL from ``[shardsink] shard_urls`` is listed even before its shard exists.
"""

from __future__ import annotations

import logging
import re

from shardsink.errors import InvalidUsageError
from shardsink.storage.url import parse_url

log = logging.getLogger(__name__)


def configured_urls() -> list[str]:
    """``[shardsink] shard_urls`` (comma/whitespace separated), normalised; invalid entries are logged."""
    from airflow.configuration import conf

    raw = conf.get("shardsink", "shard_urls", fallback="") or ""
    entries = [u for u in re.split(r"[\s,]+", raw) if u]
    for u in entries:
        if "://" not in u:  # a bare path would resolve against the api-server's working directory
            log.warning("[shardsink] shard_urls entry %r ignored: expected file:///abs/path or s3://bucket/prefix", u)
    return _normalised(u for u in entries if "://" in u)


def leak_grace_seconds() -> float:
    """``[shardsink] leak_grace_seconds``: the grace period the page classifies objects by (GC's default)."""
    from airflow.configuration import conf

    from shardsink.core.checks import check_seconds
    from shardsink.maintenance.gc_types import DEFAULT_GRACE_S

    return check_seconds(conf.getfloat("shardsink", "leak_grace_seconds", fallback=DEFAULT_GRACE_S),
                         what="[shardsink] leak_grace_seconds")


def asset_urls() -> list[str]:
    """URIs of the active assets that are shard URLs (file:// or s3://), normalised."""
    from airflow.models.asset import AssetActive, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import and_, select

    with create_session() as session:
        uris = session.scalars(
            select(AssetModel.uri).join(AssetActive, and_(AssetActive.name == AssetModel.name,
                                                          AssetActive.uri == AssetModel.uri))
        ).all()
    return _normalised(u for u in uris if u.startswith(("file://", "s3://")))


def _normalised(urls: object) -> list[str]:
    out: list[str] = []
    for u in urls:  # type: ignore[attr-defined]
        try:
            n = str(parse_url(u))
        except InvalidUsageError as e:
            log.warning("not a shard URL, ignored: %s", e)
            continue
        if n not in out:
            out.append(n)
    return out
