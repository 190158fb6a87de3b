"""What operators see: a data shard's remap shard and source frontier; a remap shard's bindings."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shardsink.core.shard import Shard
from shardsink.reclock import health
from shardsink.reclock.remap import RemapShard
from shardsink.reclock.source import Routing, resumption


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reclock_info(shard: Shard) -> dict[str, Any] | None:
    """For a reclocked data shard: its remap shard, source frontier, resumption and health; else None.

    ``source_frontier`` is the newest binding's frontier (what the source had reached
    when last bound); ``resume_frontier`` is where a restart reads from: the frontier
    bound at ``min(upper of every output shard) - 1``.
    """
    side = health.read_sidecar(shard.url)
    if side is None:
        return None
    remap_url = side["remap"]
    remap = RemapShard.open(remap_url)
    b = remap.bindings()
    outputs = Routing.from_spec(side.get("source", {})).shard_urls(shard.url)
    resume, low = resumption(b, outputs)
    return {
        "remap": remap_url,
        "source_kind": side.get("source", {}).get("kind"),
        "remap_upper": b.upper,
        "bindings": len(b.history),
        "source_frontier": b.latest(),
        "resume_frontier": resume,
        "resume_from_upper": low,
        "outputs": outputs,
        "health": health.status(remap, b),
    }


def bindings_json(remap_url: str) -> dict[str, Any]:
    """Every binding of the remap shard: time -> frontier, and the files first bound then."""
    remap = RemapShard.open(remap_url)
    b = remap.bindings()
    return {
        "remap": remap.url,
        "upper": b.upper,
        "since": b.since,
        "bindings": [
            {"time": x.time, "at": iso(x.time), "frontier": dict(x.frontier),
             "files": [{"ordinal": f.ordinal, "key": f.key, "size": f.size} for f in x.files]}
            for x in b.history
        ],
        "health": health.status(remap, b),
    }
