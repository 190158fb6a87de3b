"""The read plan of one description: which offsets (and files) it holds, with their times.

Mint computes it from the bindings it just read or minted and publishes it as
``plans/<lower>-<upper>.json`` in the remap shard's root, so that each writer slot reads
one small object instead of the remap shard's state and parts.

SUBTLE: the plan is a cache, never a source of truth. Its content is a pure function of
bindings that are final (every time ``< upper`` is bound before the plan is written), so
any number of racing mints write identical bytes and a plain put is safe. A missing
plan (e.g. removed by cleanup) is rebuilt from the remap shard; a plan whose bounds do
not match is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shardsink.errors import CorruptionError
from shardsink.reclock.bindings import FILES, Bindings, BoundFile, Span, spans
from shardsink.storage.url import open_blob

FORMAT = 1


@dataclass(frozen=True)
class Plan:
    lower: int
    upper: int
    spans: tuple[Span, ...]
    files: dict[int, BoundFile]


def key(lower: int, upper: int) -> str:
    return f"plans/{lower}-{upper}.json"


def build(bindings: Bindings, lower: int, upper: int) -> Plan:
    sp = tuple(spans(bindings, lower, upper))
    wanted = {o for s in sp if s.partition == FILES for o in range(s.start, s.end)}
    files = {o: f for o, f in bindings.files().items() if o in wanted} if wanted else {}
    missing = sorted(wanted - set(files))
    if missing:
        raise CorruptionError(f"remap: file ordinals {missing[:5]} are bound but no file is recorded for them")
    return Plan(lower, upper, sp, files)


def publish(remap_url: str, bindings: Bindings, lower: int, upper: int) -> Plan:
    p = build(bindings, lower, upper)
    doc = {"format": FORMAT, "lower": lower, "upper": upper,
           "spans": [[s.partition, s.start, s.end, s.time] for s in p.spans],
           "files": [[f.ordinal, f.key, f.size] for f in p.files.values()]}
    open_blob(remap_url).put(key(lower, upper), json.dumps(doc, sort_keys=True).encode())
    return p


def load(remap_url: str, lower: int, upper: int) -> Plan:
    """The published plan of ``[lower, upper)``, or one rebuilt from the remap shard."""
    got = open_blob(remap_url).get(key(lower, upper))
    if got is None:
        from shardsink.reclock.remap import RemapShard

        return build(RemapShard.open(remap_url).bindings(), lower, upper)
    try:
        doc = json.loads(got.data)
        if (doc["format"], doc["lower"], doc["upper"]) != (FORMAT, lower, upper):
            raise ValueError(f"describes [{doc['lower']}, {doc['upper']}) format {doc['format']}")
        sp = tuple(Span(str(p), int(a), int(b), int(t)) for p, a, b, t in doc["spans"])
        files = {int(o): BoundFile(int(o), str(k), int(n)) for o, k, n in doc["files"]}
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{remap_url}/{key(lower, upper)} is unreadable: {e}") from e
    return Plan(lower, upper, sp, files)
