"""A description's staging manifests: one per writer slot, written after its parts, verified before append.

Contract: ``staging/<desc_id>/slot-<i>.json`` (:class:`shardsink.core.manifests.ManifestDoc`)
lists the parts slot ``i``'s successful write attempt staged under ``parts/<desc_id>/``, its
row count, the source inputs it read and its props. :func:`write_manifest` is a plain put (a
retried write attempt replaces it; so may a killed attempt's job still running: the last put
wins, the append commits the manifest it read, and the other attempt's parts are leftovers that
the append's cleanup or GC deletes); :func:`read_manifests` / :func:`verified_manifests`
return all of a description's manifests or raise CorruptionError naming every missing or
inconsistent one (another batch or slot layout, parts outside the description or not in
the store).

Schema ids: a manifest records the schema id its parts were written with (the writer's state
version's current schema), and the append labels the batch with it, so a schema change
landing between staging and commit never mislabels the parts. A manifest without one (an
older writer) is resolved by :func:`staged_schema_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from shardsink.core.manifests import MANIFEST_FORMAT, ManifestDoc
from shardsink.core.schema import history
from shardsink.core.shard import Shard, StagedBatch, default_writer
from shardsink.core.state import Header, PartMeta
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.sinks.description import Description


def write_manifest(
    shard: Shard, desc: Description, *, slot: int, slots: int, parts: Sequence[PartMeta],
    inputs: Sequence[dict[str, Any]] = (), props: Mapping[str, str] | None = None,
    schema_id: int | None = None,
) -> dict[str, Any]:
    """Publish what slot ``slot`` staged (a plain put: a retried write attempt replaces it);
    returns the manifest as plain values.

    ``schema_id``: the shard's schema id the parts were written with, i.e. the current schema
    id of the state version whose schema the writer used (``schema.current(header).id``).
    SUBTLE: pass it; None publishes "unknown", which the append accepts only while no schema
    change can have landed since the description was minted (:func:`staged_schema_id`).

    ``props`` are recorded in the commit info if every slot of ``desc`` publishes the same
    ones (:func:`shardsink.sinks.append.append_from_manifests`). SUBTLE: they travel in the same document as the
    parts, so a commit never pairs one attempt's parts with another attempt's props.
    """
    if schema_id is not None and (isinstance(schema_id, bool) or not isinstance(schema_id, int)
                                  or not 0 <= schema_id < 2**31):
        raise InvalidUsageError(f"schema_id {schema_id!r:.60} is not a schema id (an int in [0, 2^31)) or None",
                                value=str(schema_id)[:60])
    doc = ManifestDoc(
        format=MANIFEST_FORMAT, desc_id=desc.desc_id, lower=desc.lower, upper=desc.upper, attempt=desc.attempt,
        slot=slot, slots=slots, rows=sum(p.rows for p in parts), parts=tuple(parts), inputs=tuple(inputs),
        writer=default_writer(), written_at=datetime.now().astimezone().isoformat(timespec="milliseconds"),
        props=dict(props or {}), schema_id=schema_id,
    )
    shard.writer().put_manifest(doc)
    out: dict[str, Any] = msgspec.to_builtins(doc)
    return out


def read_manifests(shard: Shard, desc: Description, slots: int) -> list[StagedBatch]:
    """All ``slots`` manifests of ``desc`` as staged batches, verified against the store.

    Raises CorruptionError naming every missing or inconsistent manifest, or a listed
    part that is not in the store.
    """
    docs = verified_manifests(shard, desc, slots)
    header = shard.reader().head().header if any(d.schema_id is None for d in docs) else None
    return [StagedBatch(desc.desc_id, desc.lower, desc.upper, doc.parts,
                        staged_schema_id(doc, desc, header, url=shard.url)) for doc in docs]


def staged_schema_id(doc: ManifestDoc, desc: Description, header: Header | None, *, url: str) -> int:
    """The schema id the parts of ``doc`` were written with, for the append to record.

    The manifest's own id when it has one (the commit still refuses an id the shard does not
    know). A manifest without one (written by a writer older than schema evolution) is resolved
    from ``header`` (a state version read after the manifests): a shard that never evolved → 0;
    else the current schema, if it was made current at an upper below ``desc.lower``: that change
    committed before the shard's upper reached ``desc.lower``, so before the description was
    minted (a mint's lower is the upper it read) and before its writer read its schema. Anything
    else (a schema change at or after the upper ``desc.lower``) cannot be told apart from a
    change between staging and commit: InvalidUsageError (bad input) naming the slot; nothing is
    committed or deleted, and re-running the write task with a current writer stages it anew.
    """
    if doc.schema_id is not None:
        return doc.schema_id
    if header is None:
        raise AssertionError("staged_schema_id: a manifest without a schema id needs a state version")
    hist = history(header)
    cur = hist[-1]
    if len(hist) == 1 or (cur.upper is not None and cur.upper < desc.lower):
        return cur.id
    raise InvalidUsageError(
        f"cannot append description {desc.desc_id} [{desc.lower}, {desc.upper}) to {url}: the manifest of slot "
        f"{doc.slot} records no schema id (written by an older writer) and schema {cur.id} was made current at "
        f"upper {cur.upper}, not before the description's lower {desc.lower}, so its parts may have been written "
        "with an older schema; re-run the write task to stage it with a writer that records the schema id",
        value=desc.desc_id)


def verified_manifests(shard: Shard, desc: Description, slots: int) -> list[ManifestDoc]:
    """:func:`read_manifests`, as the verified documents.

    SUBTLE (an orphaned write job: a killed write task's job still running beside the task's
    retry): the manifests are read BEFORE the parts are listed. An attempt uploads its parts
    before it publishes its manifest, and the parts a published manifest names are deleted only
    once the description's fate is final, so a later listing holds every part of a manifest
    already read, whichever attempt's it is (else the caller's fresh fate read settles it).
    Listing first would miss the parts of a manifest an orphan publishes between the two reads,
    and report its slot as corrupt: the append task would fail at once, not retried.
    """
    problems: list[str] = []
    staged: list[ManifestDoc] = []
    w = shard.writer()
    docs: dict[int, ManifestDoc | None] = {}  # the readable ones
    for slot in range(slots):
        try:
            docs[slot] = w.get_manifest(desc.desc_id, slot)
        except CorruptionError as e:
            problems.append(f"slot {slot}: manifest {e}")
    present = w.list_staged(desc.desc_id)
    mine = f"{w.parts_prefix(desc.desc_id)}/"
    for slot, doc in docs.items():
        key = w.manifest_key(desc.desc_id, slot)
        if doc is None:
            problems.append(f"slot {slot}: manifest {key} is missing (its write task did not finish)")
            continue
        if (doc.desc_id, doc.lower, doc.upper, doc.slot, doc.slots) != (desc.desc_id, desc.lower, desc.upper,
                                                                          slot, slots):
            problems.append(f"slot {slot}: manifest {key} describes another batch or slot layout")
            continue
        foreign = [p.key for p in doc.parts if not p.key.startswith(mine)]
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
