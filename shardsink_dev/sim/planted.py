"""Defects this project fixed, re-introduced behind a test-only switch, to prove the simulator finds them.

Nothing here is reachable from the library: :func:`planted` is a context manager the simulator's
command line and tests enter (``--plant NAME``), which swaps one library function for the
defective version of it that once shipped (or its exact equivalent), in every module that
imported it, and restores the original on exit. Each defect names the fix that removed it:

==========================  ==================================================================
``compaction-seals``        a compaction's commit taken as a seal of its merged range (fixed in
                            issue 36: "A compaction ... seals nothing"), so a late file
                            re-sealed by maintenance looks on time and is half ingested
``list-before-manifests``   :func:`shardsink.core.staged.verified_manifests` listing the parts
                            before reading the manifests: an orphaned write publishing between
                            the two reads is reported as corruption and the append fails
``delete-on-unknown``       the staged parts deleted when the commit's outcome is unknown: a
                            commit that landed loses its parts
``run-of-last-a``           :func:`shardsink.sinks.description.run_of` splitting at the last
                            ``-a`` (commit d629e14): a waiting append names the wrong DAG run
``delete-still-possible``   the fate primitive deleting a description that may still commit
``late-unsealed``           the late check judging times no commit sealed yet (commit 084b663):
                            an on-time file read by a description minted ahead is refused
``seal-at-commit``          seals stamped with the commit's time, not the listing's (commit
                            0c18f02): a file landing between a mint's listing and its commit is
                            neither read nor refused, its rows silently dropped
==========================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from shardsink.core import fate as fate_mod
from shardsink.core import staged as staged_mod
from shardsink.core.commits import END_OF_TIME, CompactCommit
from shardsink.core.fate import CannotCommit
from shardsink.core.shard import Shard
from shardsink.core.write import WriteHandle
from shardsink.errors import CorruptionError, UnknownOutcomeError
from shardsink.sinks import description as description_mod
from shardsink.sinks import seals as seals_mod
from shardsink.sinks.description import _UNSAFE
from shardsink.sources.base import Seal
from shardsink.sources.landing import files as landing_files_mod
from shardsink.sources.landing.files import LateDataError


def _swap(original: Any, replacement: Any) -> list[tuple[Any, str, Any]]:
    """Every module global of shardsink (and the simulator) naming ``original`` now names ``replacement``."""
    undo = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("shardsink") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                undo.append((mod, attr, value))
                setattr(mod, attr, replacement)
    return undo


# --- the defects ------------------------------------------------------------------------------


def _compaction_seals(self: Any) -> tuple[int, int] | None:
    return (self.lower, self.upper if self.upper is not None else END_OF_TIME)


def _list_first(w: WriteHandle, *, desc_id: str, lower: int, upper: int | None, slots: int) -> list[Any]:
    """verified_manifests as it was: the parts listed BEFORE the manifests are read."""
    present = w.list_staged(desc_id)
    problems, staged = [], []
    for slot in range(slots):
        doc = w.get_manifest(desc_id, slot)
        if doc is None:
            problems.append(f"slot {slot}: manifest missing")
        elif [p.key for p in doc.parts if p.key not in present]:
            problems.append(f"slot {slot}: parts missing")
        else:
            staged.append(doc)
    if problems:
        raise CorruptionError(f"cannot append description {desc_id}: " + "; ".join(problems))
    return staged


def _deleting_on_unknown(original: Callable[..., Any]) -> Callable[..., Any]:
    def compare_and_append(self: WriteHandle, staged: Sequence[Any], **kw: Any) -> Any:
        try:
            return original(self, staged, **kw)
        except UnknownOutcomeError:
            self.delete_staged(kw["desc_id"], kw["expected_upper"], decided=CannotCommit(kw["expected_upper"]))
            raise
    return compare_and_append


def _run_of_last_a(desc_id: str, dag_id: str) -> str | None:
    dag = _UNSAFE.sub("-", dag_id).strip("-.")[:40] or "dag"
    if not desc_id.startswith(f"{dag}-"):
        return None
    rest = desc_id[len(dag) + 1:]
    cut = rest.rfind("-a")
    return rest[:cut] if cut > 0 else None


def _deleting_still_possible(original: Callable[..., Any]) -> Callable[..., Any]:
    def delete_staged_many(machine: Any, condemned: Sequence[Any]) -> Any:
        return original(machine, [dataclasses.replace(c, unpublished=True) if c.inputs is None else c
                                  for c in condemned])
    return delete_staged_many


def _late_unsealed(tmin: int, key: str, appeared: float, *, lower: int, seals: Sequence[Seal], root: str) -> None:
    """check_late_at without its rule that times no commit sealed yet are never late."""
    if tmin >= lower or not seals:
        return
    seal = max((s for s in seals if s.lower <= tmin < s.upper), key=lambda s: s.at, default=None)
    if seal is None:
        seal = min(seals, key=lambda s: s.lower)
    if appeared >= seal.at and (key, appeared) not in seal.held:
        raise LateDataError(f"late file {root}/{key}: its earliest event time {tmin} was sealed by commit seqno "
                            f"{seal.seqno}", value=tmin)


def _seals_at_commit(original: Callable[..., list[Seal]]) -> Callable[..., list[Seal]]:
    """seals() as it was: every seal stamped with its commit's time, whatever listing fixed the input."""
    def seals(shard: Shard, *args: Any, **kw: Any) -> list[Seal]:
        reader = shard.reader()
        out = []
        for s in original(shard, *args, **kw):
            v = reader.version(s.seqno)
            at = datetime.fromisoformat(v.commit.at).timestamp() if v is not None else s.at
            out.append(Seal(s.lower, s.upper, s.seqno, at))
        return out
    return seals


DEFECTS: dict[str, str] = {
    "compaction-seals": "a compaction's commit sealing its merged range",
    "list-before-manifests": "verified_manifests listing parts before reading manifests",
    "delete-on-unknown": "staged parts deleted on an unknown commit outcome",
    "run-of-last-a": "run_of splitting a description id at its last '-a'",
    "delete-still-possible": "the fate primitive deleting a description that may still commit",
    "late-unsealed": "the late check judging times no commit sealed yet",
    "seal-at-commit": "seals stamped at the commit, not at the mint's listing",
}


@contextmanager
def planted(name: str | None) -> Iterator[None]:
    """Run the block with defect ``name`` planted (None: none); restores the library after."""
    if name is not None and name not in DEFECTS:
        raise ValueError(f"unknown defect {name!r}; known: {', '.join(DEFECTS)}")
    undo: list[tuple[Any, str, Any]] = []
    try:
        if name == "compaction-seals":
            undo.append((CompactCommit, "sealed", CompactCommit.sealed))
            CompactCommit.sealed = _compaction_seals  # type: ignore[method-assign, assignment]
        elif name == "list-before-manifests":
            undo += _swap(staged_mod.verified_manifests, _list_first)
        elif name == "delete-on-unknown":
            undo.append((WriteHandle, "compare_and_append", WriteHandle.compare_and_append))
            WriteHandle.compare_and_append = _deleting_on_unknown(  # type: ignore[method-assign]
                WriteHandle.compare_and_append)
        elif name == "run-of-last-a":
            undo += _swap(description_mod.run_of, _run_of_last_a)
        elif name == "delete-still-possible":
            undo += _swap(fate_mod.delete_staged_many, _deleting_still_possible(fate_mod.delete_staged_many))
        elif name == "late-unsealed":
            undo += _swap(landing_files_mod.check_late_at, _late_unsealed)
        elif name == "seal-at-commit":
            undo += _swap(seals_mod.seals, _seals_at_commit(seals_mod.seals))
        yield
    finally:
        for obj, attr, value in reversed(undo):
            setattr(obj, attr, value)

