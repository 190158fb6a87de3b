"""The landed-file index as stored: a base document and a ring of small delta segments, so an
update costs what changed (:mod:`shardsink.sources.landing.index` builds the entries).

* ``landing/index.json`` (the base): every entry as of delta ``upto`` of its ``epoch`` (a random
  id minted with each base that starts a new life: a deleted, unreadable or foreign base).
* ``landing/index-delta/<seq % RING>.json``: the entries one update added (new and changed
  files only) as delta ``seq`` of ``epoch``. A reader takes the base, then deltas
  ``upto + 1, upto + 2, ...`` while the ring slot holds exactly that epoch and seq; a later
  entry for a key replaces an earlier one. So a read costs the base and at most ``RING``
  small GETs, plus the one that ends the chain.
* Consolidation: an update that finds ``RING`` live deltas (the next slot would overwrite one
  the base does not hold yet) writes a new base instead (same epoch, ``upto`` = the last
  delta): once every ``RING + 1`` updates, the index is rewritten whole.

Every write is conditional: a delta on the slot's etag as read (None: absent), the base on
the base's. SUBTLE (racing mints): the loser re-reads base and deltas and writes what is
still missing as the next delta (entries for the same file and listing are equal, so a merge
never loses a fact). A delta may only replace a slot whose seq the current base holds
(``seq - RING <= upto``); ``upto`` never decreases, so no live delta is ever overwritten.
A crash while writing leaves the previous objects (a put is atomic); a lost, torn or
foreign delta ends the chain there: the entries after it cost one re-index, never wrong
data, since :func:`shardsink.sources.landing.index.refresh` trusts an entry only while
the listing shows the file unchanged. Slots of an old epoch are ignored and overwritten.
A ``/1`` base (one document, no deltas) is read as a base without epoch: the first update
rewrites it as a ``/2`` base.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import msgspec

from shardsink import hooks
from shardsink.core.roots import RootObjects
from shardsink.errors import ConditionFailedError, StorageError, UnknownOutcomeError
from shardsink.sources.landing.layout import INDEX_KEY, delta_key

log = logging.getLogger("shardsink.sources")

FORMAT = "shardsink.landing-index/2"
FORMAT_V1 = "shardsink.landing-index/1"
DELTA_FORMAT = "shardsink.landing-index-delta/1"
#: Delta slots: a read costs at most this many small GETs after the base.
RING = 8
_SAVE_ATTEMPTS = 8


class IndexEntry(msgspec.Struct, frozen=True, array_like=True):
    """One landed file (see :mod:`shardsink.sources.landing.index`); ``tmin`` / ``tmax`` None: no rows."""

    key: str
    size: int
    modified: float
    identity: str
    fmt: str
    rows: int
    tmin: int | None
    tmax: int | None
    schema: str
    first_seen: float
    #: Judged on time against the commit that sealed ``tmin`` (:func:`shardsink.sources.landing.index.judge`):
    #: final (a later seal of ``tmin`` is a correction's, which only re-seals), so no later run checks it again.
    judged: bool = False


class LandingIndexDoc(msgspec.Struct, frozen=True, kw_only=True):
    """The base document; ``epoch`` "" only in a ``/1`` document."""

    format: str = FORMAT
    root: str
    time_column: str
    epoch: str = ""
    upto: int = 0
    #: fingerprint -> base64 Arrow IPC schema of the file's columns (the event time included).
    schemas: dict[str, str] = msgspec.field(default_factory=dict)
    entries: list[IndexEntry] = msgspec.field(default_factory=list)


class IndexDelta(msgspec.Struct, frozen=True, kw_only=True):
    """Delta ``seq`` of ``epoch``: the entries one update added, and their schemas."""

    format: str = DELTA_FORMAT
    root: str
    time_column: str
    epoch: str
    seq: int
    schemas: dict[str, str]
    entries: list[IndexEntry]


@dataclass
class Loaded:
    """The index as one reader saw it, and where its next write goes."""

    entries: dict[str, IndexEntry]
    schemas: dict[str, str]
    base_etag: str | None
    #: "": no base this writer may extend with deltas (absent, unreadable, foreign, ``/1``).
    epoch: str
    upto: int
    #: The last delta read (``upto`` when none).
    last: int
    #: The etag of ring slot ``last + 1`` as read (None: absent).
    slot_etag: str | None
    #: False: a newer format owns the index (left to its writer).
    writable: bool = True


def _decode(data: bytes, typ: type[msgspec.Struct], formats: tuple[str, ...]) -> tuple[msgspec.Struct | None, bool]:
    """``(doc, known)``: doc None if unreadable or not one of ``formats``; known False for a
    format of the same family that is not in ``formats`` (a newer writer's)."""
    family = formats[0].rsplit("/", 1)[0] + "/"
    try:
        fmt = msgspec.json.decode(data, type=dict).get("format")
        if fmt not in formats:
            return None, not (isinstance(fmt, str) and fmt.startswith(family))
        return msgspec.json.decode(data, type=typ), True
    except (msgspec.DecodeError, msgspec.ValidationError, AttributeError):
        return None, True


def load(store: RootObjects, *, root: str, time_column: str) -> Loaded:
    """The base and its live deltas (see the module docstring); a missing, unreadable or foreign
    base reads as empty (a cache: re-scan)."""
    got = store.fetch(INDEX_KEY)
    out = Loaded({}, {}, got.etag if got is not None else None, "", 0, 0, None)
    if got is None:
        return out
    doc, known = _decode(got.data, LandingIndexDoc, (FORMAT, FORMAT_V1))
    if not known:
        log.warning("%s has a newer format: ignored (re-scanning), left to its writer", store.where(INDEX_KEY))
        out.writable = False
        return out
    if not isinstance(doc, LandingIndexDoc):
        log.warning("%s is unreadable: rebuilt from the landing zone", store.where(INDEX_KEY))
        return out
    if (doc.root, doc.time_column) != (root, time_column):
        return out
    out.entries, out.schemas = {e.key: e for e in doc.entries}, dict(doc.schemas)
    if doc.format == FORMAT_V1 or not doc.epoch:
        return out
    out.epoch, out.upto, out.last = doc.epoch, doc.upto, doc.upto
    while out.last - out.upto < RING:
        key = delta_key((out.last + 1) % RING)
        slot = store.fetch(key)
        out.slot_etag = slot.etag if slot is not None else None
        if slot is None:
            break
        delta, known = _decode(slot.data, IndexDelta, (DELTA_FORMAT,))
        if not known:
            out.writable = False
        if not isinstance(delta, IndexDelta) or (delta.epoch, delta.seq, delta.root, delta.time_column) != (
                out.epoch, out.last + 1, root, time_column):
            break  # an older delta of the ring, another life's, or a lost one: the chain ends here
        out.entries.update((e.key, e) for e in delta.entries)
        out.schemas.update(delta.schemas)
        out.last += 1
    return out


def save(store: RootObjects, loaded: Loaded, fresh: dict[str, IndexEntry], schemas: dict[str, str], *,
         root: str, time_column: str) -> None:
    """Add ``fresh`` (with their ``schemas``) to the index as a delta, or as a new base when the
    ring is full or there is no base to extend; re-read and retry on a lost race. Best effort:
    the index is a cache, so a write that cannot be made is logged, not raised."""
    for _ in range(_SAVE_ATTEMPTS):
        if not loaded.writable:
            return
        mine = {k: s for k, s in schemas.items() if any(e.schema == k for e in fresh.values())}
        try:
            if loaded.epoch and loaded.last - loaded.upto < RING:
                seq = loaded.last + 1
                delta = IndexDelta(root=root, time_column=time_column, epoch=loaded.epoch, seq=seq,
                                   schemas=dict(sorted(mine.items())),
                                   entries=sorted(fresh.values(), key=lambda e: e.key))
                hooks.fire("landing.index_put", shard_url=store.url, entries=len(delta.entries))
                store.replace(delta_key(seq % RING), msgspec.json.encode(delta), etag=loaded.slot_etag)
            else:
                merged = {**loaded.entries, **fresh}
                used = {e.schema for e in merged.values()}
                base = LandingIndexDoc(root=root, time_column=time_column, epoch=loaded.epoch or uuid.uuid4().hex,
                                       upto=loaded.last,
                                       schemas={k: v for k, v in sorted({**loaded.schemas, **mine}.items())
                                                if k in used},
                                       entries=sorted(merged.values(), key=lambda e: e.key))
                hooks.fire("landing.index_put", shard_url=store.url, entries=len(base.entries))
                store.replace(INDEX_KEY, msgspec.json.encode(base), etag=loaded.base_etag)
            return
        except ConditionFailedError:
            loaded = load(store, root=root, time_column=time_column)
            fresh = {k: e for k, e in fresh.items() if loaded.entries.get(k) != e}
            if not fresh:
                return  # a racer recorded the same facts
        except (UnknownOutcomeError, StorageError) as e:
            log.warning("could not write %s (%s): the next run indexes these files again", store.where(INDEX_KEY), e)
            return
    log.warning("%s: other mints kept writing it; left as they wrote it", store.where(INDEX_KEY))
