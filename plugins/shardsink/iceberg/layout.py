"""Where the Iceberg view of a shard lives, and the ids and names derived from shard seqnos.

Everything is under the shard's root, ``iceberg/`` (a root folder registered with core, so GC
and verify know it): ``iceberg/metadata/v<seqno>.metadata.json`` for shard version ``seqno``,
``snap-<seqno>.avro`` its manifest list, ``m-<seqno>-<digest>.avro`` the manifest of the batch
committed at ``seqno`` (its parts), ``d-<seqno>.avro`` the parts a compaction at ``seqno``
removed, and ``version-hint.text`` (a hint only: the newest metadata is found from the shard's
head). Every name is a function of the shard version it comes from, so a rewrite of the same
version produces the same objects and a second writer's conditional create is a no-op.
"""

from __future__ import annotations

import hashlib
import uuid

from shardsink.core.state import BatchMeta

TABLE = "iceberg"
METADATA = f"{TABLE}/metadata/"
HINT = f"{METADATA}version-hint.text"
#: The shard option that turns the view on, and its value.
OPTION, ON = "iceberg", "on"


def metadata_key(seqno: int) -> str:
    return f"{METADATA}v{seqno}.metadata.json"


def seqno_of_metadata(key: str) -> int | None:
    """The shard seqno of a metadata file's key (None: not a metadata file)."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith("v") and name.endswith(".metadata.json") and name[1:-14].isdigit():
        return int(name[1:-14])
    return None


def list_key(seqno: int) -> str:
    return f"{METADATA}snap-{seqno}.avro"


def manifest_key(batch: BatchMeta) -> str:
    """The manifest of one batch: its commit seqno and a digest of its id (ids are long)."""
    return f"{METADATA}m-{batch.seqno}-{hashlib.sha256(batch.desc_id.encode()).hexdigest()[:16]}.avro"


def deletes_key(seqno: int) -> str:
    return f"{METADATA}d-{seqno}.avro"


def snapshot_id(seqno: int) -> int:
    """The Iceberg snapshot id of the snapshot made for shard version ``seqno`` (positive)."""
    return seqno + 1


def seqno_of_snapshot(snapshot: int) -> int:
    return snapshot - 1


def table_uuid(url: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, url))


def location(url: str, key: str = "") -> str:
    """The full location of ``key`` under the shard at ``url`` (the table's location for ``""``)."""
    return f"{url.rstrip('/')}/{key or TABLE}"
