"""Every key of a shard's object layout, in one place; and the root objects layers above core own.

Layout under a shard root::

    state/LATEST.json                 hint: a copy of a recent version, replaced by CAS
    state/v/<seqno:020d>.json         one immutable document per committed version
    state/rollup/<seqno:020d>.json    the full batch list at that version (readers skip diffs)
    parts/<desc_id>/<uuid>.parquet    parts a description (append or compaction) staged
    staging/<desc_id>/slot-<i>.json   a writer slot's manifest of what it staged
    staging/<cid>/compaction.json     a compaction's manifest of its inputs
    leases/<lease_id>.json            read leases holding back ``since``

Capabilities above core keep their own objects beside those (a reclocked source's read
plans and health, a data shard's remap pointer). Core does not know their names: each
capability *registers* them here at import (:func:`register_root`), and GC and verify ask
:func:`registered` what is known and what GC may expire after its grace period. An object
under no known prefix and no registered name is reported by verify as unknown, never deleted.

Contract: every function here is pure; a desc id or compaction id is checked to be one key
segment by its maker (:mod:`shardsink.core.checks`), so the keys built here never escape
their prefix.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass
from typing import Literal

STATE_PREFIX = "state/"
LATEST = "state/LATEST.json"
VERSIONS_PREFIX = "state/v/"
ROLLUPS_PREFIX = "state/rollup/"
PARTS_PREFIX = "parts/"
STAGING_PREFIX = "staging/"
LEASES_PREFIX = "leases/"
#: The compaction manifest's name under ``staging/<cid>/``.
COMPACTION_MANIFEST = "compaction.json"
#: Compaction ids start so (``compact-<...>``); their staging folders are swept by compaction.
COMPACTION_ID_PREFIX = "compact-"

_VERSION = re.compile(r"^state/v/(\d{20})\.json$")
_ROLLUP = re.compile(r"^state/rollup/(\d{20})\.json$")


def version_key(seqno: int) -> str:
    return f"{VERSIONS_PREFIX}{seqno:020d}.json"


def rollup_key(seqno: int) -> str:
    return f"{ROLLUPS_PREFIX}{seqno:020d}.json"


def version_seqno(key: str) -> int | None:
    """The seqno a version key names, None for any other key."""
    m = _VERSION.match(key)
    return int(m.group(1)) if m else None


def rollup_seqno(key: str) -> int | None:
    """The seqno a rollup key names, None for any other key."""
    m = _ROLLUP.match(key)
    return int(m.group(1)) if m else None


def parts_prefix(desc_id: str, *, label: str | None = None) -> str:
    """Where ``desc_id``'s parts live (no trailing slash; part keys are ``<prefix>/<uuid>.parquet``).
    The description owns this prefix exclusively; ``label`` adds a sub-folder (correction parts)."""
    base = f"{PARTS_PREFIX}{desc_id}"
    return base if label is None else f"{base}/{label}"


def part_key(prefix: str) -> str:
    """A fresh, unique part key under ``prefix`` (a :func:`parts_prefix`): never reused, so an
    upload never overwrites an object another attempt may have listed."""
    return f"{prefix}/{uuid.uuid4().hex}.parquet"


def staging_prefix(desc_id: str) -> str:
    """Where ``desc_id``'s manifests live (trailing slash: a listing prefix)."""
    return f"{STAGING_PREFIX}{desc_id}/"


def staged_prefixes(desc_id: str) -> tuple[str, str]:
    """Both listing prefixes a description owns: its parts and its manifests."""
    return f"{parts_prefix(desc_id)}/", staging_prefix(desc_id)


def manifest_key(desc_id: str, slot: int) -> str:
    """Writer slot ``slot``'s manifest of ``desc_id``."""
    return f"{staging_prefix(desc_id)}slot-{slot}.json"


def compaction_manifest_key(cid: str) -> str:
    return f"{staging_prefix(cid)}{COMPACTION_MANIFEST}"


def is_compaction_manifest(key: str) -> bool:
    return key.startswith(f"{STAGING_PREFIX}{COMPACTION_ID_PREFIX}") and key.endswith(f"/{COMPACTION_MANIFEST}")


def lease_key(lease_id: str) -> str:
    return f"{LEASES_PREFIX}{lease_id}.json"


#: The prefixes core itself owns (every object under them belongs to the shard's state).
CORE_PREFIXES = (STATE_PREFIX, PARTS_PREFIX, STAGING_PREFIX, LEASES_PREFIX)

Expiry = Literal["never", "after_grace"]


@dataclass(frozen=True)
class RootObject:
    """A root object (``prefix=False``: an exact key) or folder (``prefix=True``) a capability
    above core keeps in a shard. ``expiry="after_grace"``: a cache GC may delete once older
    than its grace period (it is rebuilt when missing); ``"never"``: GC leaves it alone."""

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

    Idempotent for the same declaration; a key inside core's own prefixes, or one already
    declared differently, is refused (ValueError): two owners of one key is a bug.
    """
    if not key or key.startswith("/") or any(key.startswith(p) for p in CORE_PREFIXES) or key == LATEST:
        raise ValueError(f"root object {key!r} collides with the shard layout core owns")
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
    nothing of core's own layout (state, parts, manifests, leases, the hint)."""
    return (bool(key) and not key.startswith(CORE_PREFIXES) and key != LATEST and ".." not in key.split("/")
            and any(o.matches(key) for o in registered()))


def known(key: str) -> bool:
    """Whether ``key`` belongs to the layout: core's prefixes, the hint, or a registered root object."""
    return key.startswith(CORE_PREFIXES) or any(o.matches(key) for o in registered())


def expiring_prefixes() -> tuple[str, ...]:
    """Registered folders whose objects GC deletes once older than its grace period."""
    return tuple(o.key for o in registered() if o.prefix and o.expiry == "after_grace")
