"""Source health and the data shard's pointer to its remap shard: two small JSON objects.

* ``health.json`` in the remap shard's root: ``{"status": "running" | "idle" | "failing",
  "at": ISO time, "error": str | null, "frontier": {...}}``, replaced (plain put) by the
  mint step: ``running`` when a binding moved the frontier, ``idle`` when the source had
  nothing new, ``failing`` with the error when reading the source's progress failed.
* ``reclock.json`` in every output (data) shard's root: ``{"remap": url, "source": spec}``
  so that ``shardsink inspect`` on a data shard can name its remap shard.

Neither is part of any shard's state: losing one loses no progress (the bindings are
in the remap shard). Messages never contain credentials (specs never hold secrets).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from shardsink.storage.url import open_blob

HEALTH_KEY = "health.json"
SIDECAR_KEY = "reclock.json"
Status = Literal["running", "idle", "failing"]


def record(remap_url: str, status: Status, *, frontier: Mapping[str, int] | None = None,
           error: str | None = None) -> None:
    doc = {"status": status, "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
           "error": None if error is None else error[:2000], "frontier": dict(frontier or {})}
    open_blob(remap_url).put(HEALTH_KEY, json.dumps(doc, sort_keys=True).encode())


def read(remap_url: str) -> dict[str, Any] | None:
    got = open_blob(remap_url).get(HEALTH_KEY)
    return None if got is None else dict(json.loads(got.data))


def write_sidecar(shard_url: str, remap_url: str, spec: Mapping[str, Any]) -> None:
    doc = {"remap": remap_url, "source": dict(spec)}
    open_blob(shard_url).put(SIDECAR_KEY, json.dumps(doc, sort_keys=True).encode())


def read_sidecar(shard_url: str) -> dict[str, Any] | None:
    got = open_blob(shard_url).get(SIDECAR_KEY)
    return None if got is None else dict(json.loads(got.data))
