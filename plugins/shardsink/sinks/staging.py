"""A description's staging manifests: one per writer slot, written after its parts, verified before append.

Contract: ``staging/<desc_id>/slot-<i>.json`` (:class:`shardsink.core.manifests.ManifestDoc`)
lists the parts slot ``i``'s successful write attempt staged under ``parts/<desc_id>/``, its
row count, the source inputs it read and its props. :func:`write_manifest` is a plain put (a
retried write attempt replaces it); :func:`read_manifests` / :func:`verified_manifests`
return all of a description's manifests or raise CorruptionError naming every missing or
inconsistent one (another batch or slot layout, parts outside the description or not in
the store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from shardsink.core.keys import manifest_key, parts_prefix
from shardsink.core.manifests import MANIFEST_FORMAT, ManifestDoc
from shardsink.core.shard import Shard, StagedBatch, default_writer
from shardsink.core.state import PartMeta
from shardsink.errors import CorruptionError
from shardsink.sinks.description import Description


def write_manifest(
    shard: Shard, desc: Description, *, slot: int, slots: int, parts: Sequence[PartMeta],
    inputs: Sequence[dict[str, Any]] = (), props: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Publish what slot ``slot`` staged (a plain put: a retried write attempt replaces it);
    returns the manifest as plain values.

    ``props`` are recorded in the commit info if every slot of ``desc`` publishes the same
    ones (:func:`shardsink.sinks.ingest.append_from_manifests`). SUBTLE: they travel in the same document as the
    parts, so a commit never pairs one attempt's parts with another attempt's props.
    """
    doc = ManifestDoc(
        format=MANIFEST_FORMAT, desc_id=desc.desc_id, lower=desc.lower, upper=desc.upper, attempt=desc.attempt,
        slot=slot, slots=slots, rows=sum(p.rows for p in parts), parts=tuple(parts), inputs=tuple(inputs),
        writer=default_writer(), written_at=datetime.now().astimezone().isoformat(timespec="milliseconds"),
        props=dict(props or {}),
    )
    shard.writer().put_manifest(doc)
    out: dict[str, Any] = msgspec.to_builtins(doc)
    return out


def read_manifests(shard: Shard, desc: Description, slots: int) -> list[StagedBatch]:
    """All ``slots`` manifests of ``desc`` as staged batches, verified against the store.

    Raises CorruptionError naming every missing or inconsistent manifest, or a listed
    part that is not in the store.
    """
    return [StagedBatch(desc.desc_id, desc.lower, desc.upper, doc.parts)
            for doc in verified_manifests(shard, desc, slots)]


def verified_manifests(shard: Shard, desc: Description, slots: int) -> list[ManifestDoc]:
    """:func:`read_manifests`, as the verified documents."""
    problems: list[str] = []
    staged: list[ManifestDoc] = []
    w = shard.writer()
    present = w.list_staged(desc.desc_id)
    for slot in range(slots):
        key = manifest_key(desc.desc_id, slot)
        try:
            doc = w.get_manifest(desc.desc_id, slot)
        except CorruptionError as e:
            problems.append(f"slot {slot}: manifest {e}")
            continue
        if doc is None:
            problems.append(f"slot {slot}: manifest {key} is missing (its write task did not finish)")
            continue
        if (doc.desc_id, doc.lower, doc.upper, doc.slot, doc.slots) != (desc.desc_id, desc.lower, desc.upper,
                                                                          slot, slots):
            problems.append(f"slot {slot}: manifest {key} describes another batch or slot layout")
            continue
        foreign = [p.key for p in doc.parts if not p.key.startswith(f"{parts_prefix(desc.desc_id)}/")]
        gone = [p.key for p in doc.parts if p.key not in present]
        if foreign or gone:
            problems.append(f"slot {slot}: parts outside the description {foreign[:3]} or missing {gone[:3]}")
            continue
        staged.append(doc)
    if problems:
        raise CorruptionError(
            f"cannot append description {desc.desc_id} [{desc.lower}, {desc.upper}) to {shard.url}: "
            + "; ".join(problems)
        )
    return staged
