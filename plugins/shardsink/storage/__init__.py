"""Storage backends behind one interface; :func:`open_blob` picks one from a shard URL and
wraps it in its retry policy (:class:`StoreOptions`)."""

from __future__ import annotations

from shardsink.storage.base import Blob, Fetched, ObjectInfo
from shardsink.storage.options import StoreOptions
from shardsink.storage.url import ShardUrl, open_blob, parse_url

__all__ = ["Blob", "Fetched", "ObjectInfo", "ShardUrl", "StoreOptions", "open_blob", "parse_url"]
