"""Every key of core's layout inside a shard, in one place.

Layout under a shard root::

    state/LATEST.json                 hint: a copy of a recent version, replaced by CAS
    state/v/<seqno:020d>.json         one immutable document per committed version
    state/rollup/<seqno:020d>.json    the full batch list at that version (readers skip diffs)
    parts/<desc_id>/<uuid>.parquet    parts a description (append or compaction) staged
    parts/<desc_id>/<label>/<uuid>.parquet
                                      labelled parts (re-processing corrections:
                                      :func:`shardsink.core.state.correction_label`)
    staging/<desc_id>/slot-<i>.json   a writer slot's manifest of what it staged
    staging/<cid>/compaction.json     a compaction's manifest of its inputs
    leases/<lease_id>.json            read leases holding back ``since``

Core's four folders and the registry of root objects capabilities keep beside them are
:mod:`shardsink.core.roots` (which this module imports); readers ask it directly.

Contract: every function here is pure; a desc id or compaction id is checked to be one key
segment by its maker (:mod:`shardsink.core.checks`), so the keys built here never escape
their prefix.
"""

from __future__ import annotations

import re
import uuid

from shardsink.core.roots import LEASES_PREFIX, PARTS_PREFIX, STAGING_PREFIX, STATE_PREFIX

LATEST = f"{STATE_PREFIX}LATEST.json"
VERSIONS_PREFIX = f"{STATE_PREFIX}v/"
ROLLUPS_PREFIX = f"{STATE_PREFIX}rollup/"
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
