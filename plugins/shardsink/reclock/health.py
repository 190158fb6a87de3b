"""Source health and the data shard's pointer to its remap shard: two small JSON objects.

* ``health.json`` in the remap shard's root is written only when something fails
  (reading the source's progress, minting, publishing the Kafka group offsets):
  ``{"format": 1, "status": "failing", "at": ISO time, "error": str}``. The happy path writes nothing;
  :func:`status` derives the rest: ``failing`` if that failure is newer than the remap
  shard's last commit, else ``running`` when the newest sealed binding time moved the
  frontier, ``idle`` when it did not (the source had nothing new).
* ``reclock.json`` in every output (data) shard's root: ``{"format": 1, "remap": url, "source": spec}``
  so that ``shardsink inspect`` on a data shard can name its remap shard.

Neither is part of any shard's state: losing one loses no progress (the bindings are
in the remap shard). Messages never contain credentials (specs never hold secrets).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from shardsink.core.documents import ENCODER, HEALTH_KEY, SIDECAR_KEY, decode_doc
from shardsink.storage.url import open_blob

if TYPE_CHECKING:
    from shardsink.reclock.bindings import Bindings
    from shardsink.reclock.remap import RemapShard

__all__ = ["HEALTH_KEY", "SIDECAR_KEY", "read", "read_sidecar", "record_failure", "status", "write_sidecar"]

#: Format of both documents: readers accept this or older and ignore unknown fields. Both
#: were first written without a format field: a missing one reads as format 1.
FORMAT = 1


class HealthDoc(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    at: str
    error: str | None
    format: int = FORMAT


class SidecarDoc(msgspec.Struct, frozen=True, kw_only=True):
    remap: str
    source: dict[str, Any]
    format: int = FORMAT


def record_failure(remap_url: str, error: str) -> None:
    doc = HealthDoc(status="failing", at=datetime.now(UTC).isoformat(timespec="milliseconds"), error=error[:2000])
    open_blob(remap_url).put(HEALTH_KEY, ENCODER.encode(doc))


def read(remap_url: str) -> dict[str, Any] | None:
    """The last recorded failure ``{"status", "at", "error"}`` (None: none recorded);
    CorruptionError naming the object if it is unreadable or too new."""
    blob = open_blob(remap_url)
    got = blob.get(HEALTH_KEY)
    if got is None:
        return None
    doc = decode_doc(got.data, HealthDoc, what="source health", where=f"{blob.url}/{HEALTH_KEY}", newest=FORMAT,
                     default_format=1)
    return {"status": doc.status, "at": doc.at, "error": doc.error}


def status(remap: RemapShard, bindings: Bindings) -> dict[str, Any]:
    """``{"status": running | idle | failing, "at": ..., "error": ...}`` (see the module docstring)."""
    last = remap.shard.info().last_commit.at
    failure = read(remap.url)
    if failure is not None and datetime.fromisoformat(failure["at"]) > datetime.fromisoformat(last):
        return failure
    h = bindings.history
    moved = bool(h) and h[-1].time == bindings.upper - 1
    return {"status": "running" if moved else "idle", "at": last, "error": None}


def write_sidecar(shard_url: str, remap_url: str, spec: Mapping[str, Any]) -> None:
    doc = SidecarDoc(remap=remap_url, source=dict(spec))
    open_blob(shard_url).put(SIDECAR_KEY, ENCODER.encode(doc))


def read_sidecar(shard_url: str) -> dict[str, Any] | None:
    """``{"remap": url, "source": spec}`` (None: not a reclocked output); CorruptionError
    naming the object if it is unreadable or too new."""
    blob = open_blob(shard_url)
    got = blob.get(SIDECAR_KEY)
    if got is None:
        return None
    doc = decode_doc(got.data, SidecarDoc, what="reclock sidecar", where=f"{blob.url}/{SIDECAR_KEY}",
                     newest=FORMAT, default_format=1)
    return {"remap": doc.remap, "source": doc.source}
