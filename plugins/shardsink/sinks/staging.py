"""A description's staging manifests: one per writer slot, written after its parts, verified before append.

Contract: ``staging/<desc_id>/slot-<i>.json`` (:class:`shardsink.core.manifests.ManifestDoc`)
lists the parts slot ``i``'s successful write attempt staged under ``parts/<desc_id>/``, its
row count, the source inputs it read and its props. :func:`write_manifest` is a plain put (a
retried write attempt replaces it; so may a killed attempt's job still running: the last put
wins, the append commits the manifest it read, and the other attempt's parts are leftovers that
the append's cleanup or GC deletes). The append verifies them before it commits
(:mod:`shardsink.core.staged`): :func:`read_manifests` here returns what it would commit.

Schema ids: a manifest records the schema id its parts were written with (the writer's state
version's current schema), and the append labels the batch with it, so a schema change
landing between staging and commit never mislabels the parts. A manifest without one (an
older writer) is resolved by :func:`shardsink.core.staged.staged_schema_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from shardsink.core.manifests import MANIFEST_FORMAT, ManifestDoc
from shardsink.core.shard import Shard, StagedBatch, default_writer
from shardsink.core.staged import load_staged
from shardsink.core.state import PartMeta
from shardsink.errors import InvalidUsageError
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
    change can have landed since the description was minted (:func:`shardsink.core.staged.staged_schema_id`).

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
    """All ``slots`` manifests of ``desc`` as staged batches, verified against the store, as its
    append commits them (:func:`shardsink.core.staged.load_staged`).

    Raises CorruptionError naming every missing or inconsistent manifest, or a listed
    part that is not in the store.
    """
    staged, _ = load_staged(shard.writer(), shard.reader(), desc_id=desc.desc_id, lower=desc.lower,
                            upper=desc.upper, slots=slots)
    return list(staged)
