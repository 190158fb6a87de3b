"""Source health and the data shard's pointer to its remap shard: two small JSON objects.

* ``health.json`` in the remap shard's root is written only when something fails
  (reading the source's progress, minting, publishing the Kafka group offsets):
  ``{"format": 1, "status": "failing", "at": ISO time, "error": str}``. The happy path writes nothing;
  :func:`status` derives the rest: ``failing`` if that failure is newer than the remap
  shard's last commit, else ``running`` when the newest sealed binding time moved the
  frontier, ``idle`` when it did not (the source had nothing new).
* ``reclock.json`` in every output (data) shard's root: ``{"format": 1, "remap": url, "source": spec}``
  so that ``shardsink inspect`` on a data shard can name its remap shard. The spec is
  typed (:class:`SidecarDoc`, :mod:`shardsink.specs`) and stored in its dict layout, the
  layout every sidecar was written in.

Neither is part of any shard's state: losing one loses no progress (the bindings are
in the remap shard). Messages never contain credentials (specs never hold secrets).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from shardsink.core.documents import ENCODER, decode_doc
from shardsink.core.roots import RootObjects
from shardsink.errors import CorruptionError, InvalidUsageError, ShardsinkError
from shardsink.reclock.layout import HEALTH_KEY, SIDECAR_KEY
from shardsink.specs import SourceSpec, spec_from_builtins, spec_to_builtins
from shardsink.storage.retry import BEST_EFFORT, RetryPolicy

if TYPE_CHECKING:
    from shardsink.reclock.bindings import Bindings
    from shardsink.reclock.remap import RemapShard

__all__ = ["HEALTH_KEY", "SIDECAR_KEY", "read", "read_sidecar", "read_sidecar_doc", "record_failure", "status",
           "write_sidecar"]

#: Format of both documents: readers accept this or older and ignore unknown fields. Both
#: were first written without a format field: a missing one reads as format 1.
FORMAT = 1


class HealthDoc(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    at: str
    error: str | None
    format: int = FORMAT


class SidecarDoc(msgspec.Struct, frozen=True, kw_only=True):
    """``reclock.json``: the remap shard and the typed source spec (:mod:`shardsink.specs`)."""

    remap: str
    source: SourceSpec
    format: int = FORMAT


class _SidecarLayout(msgspec.Struct, frozen=True, kw_only=True):
    """How a sidecar is stored: the spec in its dict layout, which for the built-in kinds is
    its tagged encoding, and for kinds registered at run time is ``{"kind": "module:Class", ...}``
    as sidecars always held (a tagged union cannot decode a tag it does not know)."""

    remap: str
    source: dict[str, Any]
    format: int = FORMAT


def record_failure(remap_url: str, error: str, *, policy: RetryPolicy = BEST_EFFORT) -> bool:
    """Note a failure in ``health.json`` (False: not recorded). Best effort: callers are handling
    the failure itself, so a few quick tries (``policy``, not the stores' full one) and a warning
    rather than an error that would hide the failure being reported."""
    doc = HealthDoc(status="failing", at=datetime.now(UTC).isoformat(timespec="milliseconds"), error=error[:2000])
    try:
        RootObjects(remap_url, policy=policy).put(HEALTH_KEY, ENCODER.encode(doc))
    except ShardsinkError as e:
        logging.getLogger(__name__).warning("could not record the failure in %s/%s: %s", remap_url, HEALTH_KEY, e)
        return False
    return True


def read(remap_url: str) -> dict[str, Any] | None:
    """The last recorded failure ``{"status", "at", "error"}`` (None: none recorded);
    CorruptionError naming the object if it is unreadable or too new."""
    roots = RootObjects(remap_url)
    got = roots.get(HEALTH_KEY)
    if got is None:
        return None
    doc = decode_doc(got, HealthDoc, what="source health", where=roots.where(HEALTH_KEY), newest=FORMAT,
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


def write_sidecar(shard_url: str, remap_url: str, spec: Mapping[str, Any] | SourceSpec) -> None:
    doc = SidecarDoc(remap=remap_url, source=spec_from_builtins(spec))
    RootObjects(shard_url).put(SIDECAR_KEY, ENCODER.encode(_SidecarLayout(remap=doc.remap,
                                                                        source=spec_to_builtins(doc.source))))


def read_sidecar_doc(shard_url: str) -> SidecarDoc | None:
    """The typed sidecar (None: not a reclocked output); CorruptionError naming the object if
    it is unreadable, too new, or its source spec does not fit its kind."""
    roots = RootObjects(shard_url)
    got = roots.get(SIDECAR_KEY)
    if got is None:
        return None
    where = roots.where(SIDECAR_KEY)
    doc = decode_doc(got, _SidecarLayout, what="reclock sidecar", where=where, newest=FORMAT,
                     default_format=1)
    try:
        source = spec_from_builtins(doc.source, where=f"{where}: source spec")
    except InvalidUsageError as e:
        raise CorruptionError(f"unreadable reclock sidecar: {e}") from e
    return SidecarDoc(remap=doc.remap, source=source, format=doc.format)


def read_sidecar(shard_url: str) -> dict[str, Any] | None:
    """``{"remap": url, "source": spec}`` with the spec's dict layout (None: not a reclocked
    output); CorruptionError naming the object if it is unreadable or too new.
    :func:`read_sidecar_doc` gives the typed document."""
    doc = read_sidecar_doc(shard_url)
    if doc is None:
        return None
    return {"remap": doc.remap, "source": spec_to_builtins(doc.source)}
