"""What a caller says about a description's fate: the two answers that are not plain success.

:func:`check_same_bounds`: an id names one description, so a committed id asked about with
other bounds is a conflict, never "already committed" (whose rows would be dropped).
:func:`unknown_fate_error`: the evidence is older than the retained history, so the answer
is "unknown" (:class:`shardsink.errors.FateUnknownError`, exit 5), never "not committed".
"""

from __future__ import annotations

from shardsink.core.fate import Committed, Unknown
from shardsink.errors import DescriptionConflictError, FateUnknownError


def check_same_bounds(url: str, desc_id: str, fate: Committed, lower: int, upper: int | None) -> None:
    """DescriptionConflictError unless ``desc_id`` committed exactly ``[lower, upper)``.

    An id names one description: a request reusing a committed id with other bounds is
    refused (its rows would otherwise be dropped as "already committed").
    """
    if fate.lower is not None and (fate.lower, fate.upper) != (lower, upper):
        raise DescriptionConflictError(
            f"description id {desc_id!r} was committed on {url} as [{fate.lower}, {fate.upper}) at seqno "
            f"{fate.seqno}; this request is [{lower}, {upper}): an id names one description, use a fresh id "
            "for other bounds (nothing was written for this request)", value=desc_id)


def unknown_fate_error(url: str, desc_id: str, lower: int, upper: int | None, fate: Unknown) -> FateUnknownError:
    """The error that says so when a caller asks "did it commit?" and the fate is Unknown."""
    return FateUnknownError(
        f"whether description {desc_id} [{lower}, {upper}) was committed on {url} is unknown: the evidence is "
        f"older than the retained history (oldest retained state version {fate.oldest}; GC removed the version "
        f"that sealed time {lower}, and no retained batch or compaction lineage names it). It can no longer "
        f"commit. Do not re-send its rows under a fresh description before checking the shard's changes over "
        f"[{lower}, {upper}) (shard upper {fate.upper})", value=desc_id)
