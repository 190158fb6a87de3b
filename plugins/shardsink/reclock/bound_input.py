"""The bound input of one description: which source offsets (and files) it holds, with their times.

Mint computes it from the bindings it just read or minted and publishes it as
``plans/<lower>-<upper>.json`` in the remap shard's root, so that each writer slot reads
one small object instead of the remap shard's state and parts.

SUBTLE: the bound input is a cache, never a source of truth. Its content is a pure function of
bindings that are final (every time ``< upper`` is bound before it is written), so
any number of racing mints write identical bytes and a plain put is safe. A missing
one (e.g. aged out by GC: ``maintenance.gc`` deletes them after its grace period)
is rebuilt from the remap shard; one whose bounds do not match is refused. (Stored under ``plans/``, the name
these documents had before "plan" came to mean only a read's part plan, :mod:`shardsink.core.plan`.)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from shardsink.core.documents import ENCODER, decode_doc
from shardsink.core.roots import RootObjects
from shardsink.errors import CorruptionError
from shardsink.reclock.bindings import FILES, Bindings, BoundFile, Span, spans
from shardsink.reclock.layout import PLANS_PREFIX

#: Format of bound inputs: readers accept this or older and ignore unknown fields.
FORMAT = 1


class BoundInputDoc(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``plans/<lower>-<upper>.json``: spans as ``[partition, start, end, time]`` and files as
    ``[ordinal, key, size]`` (arrays, not objects: one may list many files)."""

    format: int
    lower: int
    upper: int
    spans: tuple[tuple[str, int, int, int], ...]
    files: tuple[tuple[int, str, int], ...]
    #: The files' identities, in ``files`` order (absent in documents written before them).
    identities: tuple[str, ...] = ()


@dataclass(frozen=True)
class BoundInput:
    lower: int
    upper: int
    spans: tuple[Span, ...]
    files: dict[int, BoundFile]


def key(lower: int, upper: int) -> str:
    return f"{PLANS_PREFIX}{lower}-{upper}.json"


def build(bindings: Bindings, lower: int, upper: int) -> BoundInput:
    sp = tuple(spans(bindings, lower, upper))
    wanted = {o for s in sp if s.partition == FILES for o in range(s.start, s.end)}
    files = {o: f for o, f in bindings.files().items() if o in wanted} if wanted else {}
    missing = sorted(wanted - set(files))
    if missing:
        raise CorruptionError(f"remap: file ordinals {missing[:5]} are bound but no file is recorded for them")
    return BoundInput(lower, upper, sp, files)


def publish(remap_url: str, bindings: Bindings, lower: int, upper: int) -> BoundInput:
    p = build(bindings, lower, upper)
    doc = BoundInputDoc(format=FORMAT, lower=lower, upper=upper,
                  spans=tuple((s.partition, s.start, s.end, s.time) for s in p.spans),
                  files=tuple((f.ordinal, f.key, f.size) for f in p.files.values()),
                  identities=tuple(f.identity for f in p.files.values()) if any(f.identity for f in p.files.values())
                  else ())
    RootObjects(remap_url).put(key(lower, upper), ENCODER.encode(doc))
    return p


def load(remap_url: str, lower: int, upper: int) -> BoundInput:
    """The published bound input of ``[lower, upper)``, or one rebuilt from the remap shard.
    CorruptionError naming the object if it is unreadable, too new, or of other bounds."""
    got = RootObjects(remap_url).get(key(lower, upper))
    if got is None:
        from shardsink.reclock.remap import RemapShard

        return build(RemapShard.open(remap_url).bindings(), lower, upper)
    return decode(got, lower, upper, where=f"{remap_url}/{key(lower, upper)}")


def decode(data: bytes, lower: int, upper: int, *, where: str) -> BoundInput:
    doc = decode_doc(data, BoundInputDoc, what="bound input", where=where, newest=FORMAT)
    if (doc.lower, doc.upper) != (lower, upper):
        raise CorruptionError(f"{where}: bound input describes [{doc.lower}, {doc.upper}), expected [{lower}, {upper})")
    sp = tuple(Span(p, a, b, t) for p, a, b, t in doc.spans)
    ids = doc.identities if len(doc.identities) == len(doc.files) else ("",) * len(doc.files)
    files = {o: BoundFile(o, k, n, i) for (o, k, n), i in zip(doc.files, ids, strict=True)}
    return BoundInput(lower, upper, sp, files)
