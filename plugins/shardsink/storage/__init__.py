"""Storage backends behind one interface; :func:`open_blob` picks one from a shard URL."""

from __future__ import annotations

from shardsink.storage.base import Blob, Fetched, ObjectInfo
from shardsink.storage.url import ShardUrl, open_blob, parse_url

__all__ = ["Blob", "Fetched", "ObjectInfo", "ShardUrl", "open_blob", "parse_url"]
