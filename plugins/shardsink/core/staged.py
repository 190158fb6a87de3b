"""What a description staged, as its append commits it: its writer slots' manifests, verified
against the store, and the schema id each slot's parts were written with.

::

    staged, props = load_staged(writer, reader, desc_id=d, lower=l, upper=u, slots=n)

Contract: ``staging/<desc_id>/slot-<i>.json`` (:class:`shardsink.core.manifests.ManifestDoc`,
published by :func:`shardsink.sinks.staging.write_manifest`) names the parts slot ``i``'s
successful write attempt staged under ``parts/<desc_id>/``. :func:`verified_manifests` returns
all of a description's manifests or raises CorruptionError naming every missing or inconsistent
one (another batch or slot layout, parts outside the description or not in the store).

Schema ids: a manifest records the schema id its parts were written with, and the append labels
the batch with it, so a schema change landing between staging and commit never relabels the
parts. A manifest without one (an older writer) is resolved by :func:`staged_schema_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardsink.core.manifests import ManifestDoc
from shardsink.core.read import ReadHandle
from shardsink.core.schema import history
from shardsink.core.state import Header
from shardsink.core.write import StagedBatch, WriteHandle
from shardsink.errors import CorruptionError, InvalidUsageError

#: A description's staged batches (one per slot) and the props its commit records.
Staged = tuple[Sequence[StagedBatch], Mapping[str, str]]


def load_staged(writer: WriteHandle, reader: ReadHandle, *, desc_id: str, lower: int, upper: int | None,
                slots: int) -> Staged:
    """The ``slots`` verified manifests of ``desc_id`` as staged batches, each labelled with the
    schema id its manifest recorded (a manifest without one: resolved from one extra head read,
    read after the manifests, or refused: :func:`staged_schema_id`), and the props the commit
    records: the slots' own if they all agree, else none (props are claims about the whole batch,
    and readers treat a missing one as "unknown")."""
    docs = verified_manifests(writer, desc_id=desc_id, lower=lower, upper=upper, slots=slots)
    header = reader.head().header if any(d.schema_id is None for d in docs) else None
    staged = [StagedBatch(desc_id, lower, upper, doc.parts,
                          staged_schema_id(doc, lower, header, url=writer.url, desc_id=desc_id)) for doc in docs]
    props = docs[0].props if all(doc.props == docs[0].props for doc in docs) else {}
    return staged, props


def staged_schema_id(doc: ManifestDoc, lower: int, header: Header | None, *, url: str, desc_id: str) -> int:
    """The schema id the parts of ``doc`` were written with, for the append to record.

    The manifest's own id when it has one (the commit still refuses an id the shard does not
    know). A manifest without one (written by a writer older than schema evolution) is resolved
    from ``header`` (a state version read after the manifests): a shard that never evolved → 0;
    else the current schema, if it was made current at an upper below ``lower``: that change
    committed before the shard's upper reached ``lower``, so before the description was minted
    (a mint's lower is the upper it read) and before its writer read its schema. Anything else
    (a schema change at or after the upper ``lower``) cannot be told apart from a change between
    staging and commit: InvalidUsageError (bad input) naming the slot; nothing is committed or
    deleted, and re-running the write task with a current writer stages it anew.
    """
    if doc.schema_id is not None:
        return doc.schema_id
    if header is None:
        raise AssertionError("staged_schema_id: a manifest without a schema id needs a state version")
    hist = history(header)
    cur = hist[-1]
    if len(hist) == 1 or (cur.upper is not None and cur.upper < lower):
        return cur.id
    raise InvalidUsageError(
        f"cannot append description {desc_id} [{lower}, {doc.upper}) to {url}: the manifest of slot "
        f"{doc.slot} records no schema id (written by an older writer) and schema {cur.id} was made current at "
        f"upper {cur.upper}, not before the description's lower {lower}, so its parts may have been written "
        "with an older schema; re-run the write task to stage it with a writer that records the schema id",
        value=desc_id)


def verified_manifests(writer: WriteHandle, *, desc_id: str, lower: int, upper: int | None,
                       slots: int) -> list[ManifestDoc]:
    """The ``slots`` manifests of ``desc_id``, each checked to describe this batch and slot layout
    and to name only parts under the description's prefix that are in the store; CorruptionError
    naming every problem otherwise.

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
    docs: dict[int, ManifestDoc | None] = {}  # the readable ones
    for slot in range(slots):
        try:
            docs[slot] = writer.get_manifest(desc_id, slot)
        except CorruptionError as e:
            problems.append(f"slot {slot}: manifest {e}")
    present = writer.list_staged(desc_id)
    mine = f"{writer.parts_prefix(desc_id)}/"
    for slot, doc in docs.items():
        key = writer.manifest_key(desc_id, slot)
        if doc is None:
            problems.append(f"slot {slot}: manifest {key} is missing (its write task did not finish)")
            continue
        if (doc.desc_id, doc.lower, doc.upper, doc.slot, doc.slots) != (desc_id, lower, upper, slot, slots):
            problems.append(f"slot {slot}: manifest {key} describes another batch or slot layout")
            continue
        foreign = [p.key for p in doc.parts if not p.key.startswith(mine)]
        gone = [p.key for p in doc.parts if p.key not in present]
        if foreign or gone:
            problems.append(f"slot {slot}: parts outside the description {foreign[:3]} or missing {gone[:3]}")
            continue
        staged.append(doc)
    if problems:
        raise CorruptionError(f"cannot append description {desc_id} [{lower}, {upper}) to {writer.url}: "
                              + "; ".join(problems))
    return staged
