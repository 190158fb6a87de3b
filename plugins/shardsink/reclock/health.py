"""Source health and the data shard's pointer to its remap shard: two small JSON objects.

* ``health.json`` in the remap shard's root is written only when something fails
  (reading the source's progress, minting, publishing the Kafka group offsets):
  ``{"status": "failing", "at": ISO time, "error": str}``. The happy path writes nothing;
  :func:`status` derives the rest: ``failing`` if that failure is newer than the remap
  shard's last commit, else ``running`` when the newest sealed binding time moved the
  frontier, ``idle`` when it did not (the source had nothing new).
* ``reclock.json`` in every output (data) shard's root: ``{"remap": url, "source": spec}``
  so that ``shardsink inspect`` on a data shard can name its remap shard.

Neither is part of any shard's state: losing one loses no progress (the bindings are
in the remap shard). Messages never contain credentials (specs never hold secrets).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shardsink.storage.url import open_blob

if TYPE_CHECKING:
    from shardsink.reclock.bindings import Bindings
    from shardsink.reclock.remap import RemapShard

HEALTH_KEY = "health.json"
SIDECAR_KEY = "reclock.json"


def record_failure(remap_url: str, error: str) -> None:
    doc = {"status": "failing", "at": datetime.now(UTC).isoformat(timespec="milliseconds"), "error": error[:2000]}
    open_blob(remap_url).put(HEALTH_KEY, json.dumps(doc, sort_keys=True).encode())


def read(remap_url: str) -> dict[str, Any] | None:
    got = open_blob(remap_url).get(HEALTH_KEY)
    return None if got is None else dict(json.loads(got.data))


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
    doc = {"remap": remap_url, "source": dict(spec)}
    open_blob(shard_url).put(SIDECAR_KEY, json.dumps(doc, sort_keys=True).encode())


def read_sidecar(shard_url: str) -> dict[str, Any] | None:
    got = open_blob(shard_url).get(SIDECAR_KEY)
    return None if got is None else dict(json.loads(got.data))
