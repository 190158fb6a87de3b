"""Root objects capabilities above core keep in a shard's store, through one checked door.

Reclocking keeps read plans and health in a remap shard and a pointer in each data shard
(:mod:`shardsink.reclock.layout`). Those layers do not open the store or spell keys of the
shard layout: they declare their objects (:func:`shardsink.core.keys.register_root`) and
read and write them through :class:`RootObjects`, which refuses any key that is not
registered (so a bug above core can never overwrite state, parts, manifests or leases).
Deleting expired caches is GC's (:meth:`shardsink.core.admin.AdminHandle.delete_registered`).
"""

from __future__ import annotations

from shardsink.core import keys
from shardsink.errors import InvalidUsageError
from shardsink.storage.base import Fetched
from shardsink.storage.retry import RetryingBlob, RetryPolicy
from shardsink.storage.url import open_blob


def _registered(key: str) -> str:
    if not keys.is_registered_root(key):
        raise InvalidUsageError(f"{key!r} is not a registered root object (shardsink.core.keys.register_root)",
                                value=key[:300])
    return key


class RootObjects:
    """Registered root objects of the shard at ``url``. ``policy``: the retry policy of these
    requests (None: the store's own, see :class:`shardsink.storage.options.StoreOptions`);
    best-effort writers (recording a failure) pass a short one."""

    def __init__(self, url: str, *, policy: RetryPolicy | None = None) -> None:
        self._blob = RetryingBlob(open_blob(url), policy=policy)
        self.url = self._blob.url

    def where(self, key: str) -> str:
        """``<shard url>/<key>``: how errors name the object."""
        return f"{self.url}/{key}"

    def put(self, key: str, data: bytes) -> None:
        """Write (replace) registered object ``key``: a plain put, last writer wins."""
        self._blob.put(_registered(key), data)

    def fetch(self, key: str) -> Fetched | None:
        """The bytes and etag of registered object ``key`` (for :meth:`replace`); None if absent."""
        return self._blob.get(_registered(key))

    def replace(self, key: str, data: bytes, *, etag: str | None) -> None:
        """Write registered object ``key`` iff its etag is still ``etag`` (None: iff it is absent);
        ConditionFailedError if another writer got there first (re-read and merge)."""
        self._blob.replace(_registered(key), data, etag=etag)

    def get(self, key: str) -> bytes | None:
        """The bytes of registered object ``key``; None if absent."""
        got = self._blob.get(_registered(key))
        return None if got is None else got.data
