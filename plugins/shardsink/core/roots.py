"""A shard's root namespace: core's four folders, and the root objects capabilities above core keep.

Core owns everything under :data:`CORE_PREFIXES` (its layout inside them is
:mod:`shardsink.core.keys`). Capabilities above core keep their own objects beside those (a
reclocked source's bound inputs and health, a data shard's remap pointer, the landing index,
slot-cancel markers). Core does not know their names: each capability *registers* them at
import (:func:`register_root`), and GC and verify ask :func:`registered` what is known and
what GC may expire after its grace period. An object under no core folder and no registered
name is reported by verify as unknown, never deleted.

Those layers do not open the store or spell keys of core's layout: they read and write their
objects through :class:`RootObjects`, which refuses any key that is not registered (so a bug
above core can never overwrite state, parts, manifests or leases). Deleting expired caches is
GC's (:meth:`shardsink.core.admin.AdminHandle.delete_registered`).

Contract: this module imports nothing of core (:mod:`shardsink.core.keys` imports it), so a
capability registers its roots without importing the layout.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from shardsink.errors import ConditionFailedError, InvalidUsageError
from shardsink.storage.base import Blob, Fetched, ObjectInfo
from shardsink.storage.retry import RetryingBlob, RetryPolicy
from shardsink.storage.url import open_blob

STATE_PREFIX = "state/"
PARTS_PREFIX = "parts/"
STAGING_PREFIX = "staging/"
LEASES_PREFIX = "leases/"
#: The folders core owns (every object under them belongs to the shard's state).
CORE_PREFIXES = (STATE_PREFIX, PARTS_PREFIX, STAGING_PREFIX, LEASES_PREFIX)

Expiry = Literal["never", "after_grace", "when_final"]


@dataclass(frozen=True)
class RootObject:
    """A root object (``prefix=False``: an exact key) or folder (``prefix=True``) a capability
    above core keeps in a shard. ``expiry="after_grace"``: a cache GC may delete once older
    than its grace period (it is rebuilt when missing); ``"when_final"``: a document of one
    description (a JSON object naming its ``desc_id`` and ``lower``), which GC deletes once
    older than its grace period AND its description's fate is final (committed, or it can never
    commit), like the description's staged parts; a document naming no description is deleted
    as a cache; ``"never"``: GC leaves it alone."""

    key: str
    owner: str
    prefix: bool = False
    expiry: Expiry = "never"

    def matches(self, key: str) -> bool:
        return key.startswith(self.key) if self.prefix else key == self.key


_lock = threading.Lock()
_registered: dict[str, RootObject] = {}


def register_root(key: str, *, owner: str, prefix: bool = False, expiry: Expiry = "never") -> RootObject:
    """Declare a root object (or, with ``prefix=True``, a folder) that ``owner`` keeps in shards.

    Idempotent for the same declaration; a key inside core's folders, an absolute one, one with
    a ``..`` segment, or one already declared differently is refused (ValueError: two owners
    of one key, or a capability reaching into core's layout, is a bug).
    """
    if (not isinstance(key, str) or not key or key.startswith("/") or key.startswith(CORE_PREFIXES)
            or ".." in key.split("/")):
        raise ValueError(f"root object {key!r} collides with the shard layout core owns")
    if expiry not in ("never", "after_grace", "when_final"):
        raise ValueError(f"root object {key!r}: expiry must be 'never', 'after_grace' or 'when_final', "
                         f"got {expiry!r}")
    obj = RootObject(key, owner, prefix, expiry)
    with _lock:
        got = _registered.setdefault(key, obj)
    if got != obj:
        raise ValueError(f"root object {key!r} is already registered as {got}, not {obj}")
    return obj


def registered() -> tuple[RootObject, ...]:
    """Every root object declared so far (by the capabilities imported in this process)."""
    with _lock:
        return tuple(_registered.values())


def is_registered_root(key: str) -> bool:
    """Whether ``key`` is a root object (or under a root folder) a capability registered, and
    nothing of core's own layout (state and its hint, parts, manifests, leases)."""
    return (bool(key) and not key.startswith(CORE_PREFIXES) and ".." not in key.split("/")
            and any(o.matches(key) for o in registered()))


def known(key: str) -> bool:
    """Whether ``key`` belongs to the layout: core's folders or a registered root object."""
    return key.startswith(CORE_PREFIXES) or any(o.matches(key) for o in registered())


def expiring_prefixes(expiry: Expiry = "after_grace") -> tuple[str, ...]:
    """Registered folders whose objects GC deletes once older than its grace period
    (``expiry="when_final"``: and once their description's fate is final)."""
    return tuple(o.key for o in registered() if o.prefix and o.expiry == expiry)


def _checked(key: str) -> str:
    if not is_registered_root(key):
        raise InvalidUsageError(f"{key!r} is not a registered root object (shardsink.core.roots.register_root)",
                                value=key[:300])
    return key


class RootObjects:
    """Registered root objects of the shard at ``url``. ``policy``: the retry policy of these
    requests (None: the store's own, see :class:`shardsink.storage.options.StoreOptions`);
    best-effort writers (recording a failure) pass a short one."""

    def __init__(self, url: str, *, policy: RetryPolicy | None = None, blob: Blob | None = None) -> None:
        """``blob``: the shard's store when the caller holds it already (core's after-commit hooks
        pass the committing machine's, saving a client); None opens ``url``."""
        self._blob = RetryingBlob(blob if blob is not None else open_blob(url), policy=policy)
        self.url = self._blob.url

    def where(self, key: str) -> str:
        """``<shard url>/<key>``: how errors name the object."""
        return f"{self.url}/{key}"

    def put(self, key: str, data: bytes) -> None:
        """Write (replace) registered object ``key``: a plain put, last writer wins."""
        self._blob.put(_checked(key), data)

    def create(self, key: str, data: bytes) -> bool:
        """Create registered object ``key`` iff it is absent (the store's conditional create);
        False, nothing written, when it exists (another writer made it first)."""
        try:
            self._blob.create(_checked(key), data)
        except ConditionFailedError:
            return False
        return True

    def list(self, prefix: str) -> list[ObjectInfo]:
        """The objects under registered folder ``prefix`` (one listing)."""
        if not any(o.prefix and prefix.startswith(o.key) for o in registered()):
            raise InvalidUsageError(f"{prefix!r} is not under a registered root folder", value=prefix[:300])
        return list(self._blob.list(prefix))

    def fetch(self, key: str) -> Fetched | None:
        """The bytes and etag of registered object ``key`` (for :meth:`replace`); None if absent."""
        return self._blob.get(_checked(key))

    def replace(self, key: str, data: bytes, *, etag: str | None) -> None:
        """Write registered object ``key`` iff its etag is still ``etag`` (None: iff it is absent);
        ConditionFailedError if another writer got there first (re-read and merge)."""
        self._blob.replace(_checked(key), data, etag=etag)

    def get(self, key: str) -> bytes | None:
        """The bytes of registered object ``key``; None if absent."""
        got = self._blob.get(_checked(key))
        return None if got is None else got.data
