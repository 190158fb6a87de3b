"""Re-processing a sealed range of an ingest source: the materialize sink's correction, per range.

A re-processing run names a past range ``[A, B)`` whose source data was fixed. Times
below the shard's upper are sealed, so nothing is rewritten; instead the run appends

    correction = (source rows in [A, B) now) − (what the shard holds for [A, B))

inside its own new description ``[U, U')`` (U = the shard's upper), stamped at
``U' - 1`` exactly like a view's correction (:func:`shardsink.spark.correction.correction_frame`,
shared). Rows are compared on their user columns (the data model's row identity); the
description also carries the source's ordinary rows in ``[U, U')``, so the boundary
skips and duplicates nothing.

"What the shard holds for [A, B)" = its updates with times in ``[A, B)`` plus every
earlier correction of a range inside ``[A, B)``. Earlier corrections are the live parts
whose record says which range they correct
(:meth:`shardsink.core.state.PartMeta.corrected_range`: the part's ``corrects`` field, set
when the correction is staged, :func:`shardsink.spark.reprocess.stage_range_correction`).
So a second run over an unchanged (or already corrected) range computes an empty correction
and writes 0 updates and 0 bytes.

HAZARDS: a new range that partially overlaps an earlier correction's range is refused
(InvalidUsageError): the earlier correction's rows carry the correction's time, not their
original one, so they cannot be split. Maintenance that merges parts must keep correction
parts apart (a merged part records no range, so re-processing over it would lose track of
the correction and apply it twice: :func:`shardsink.maintenance.schedule.holds_corrections`);
a row whose event time changed within ``[A, B)`` but whose user columns did not is
unchanged for the correction (time is not part of a row's identity).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shardsink.core.shard import Shard, ShardInfo
from shardsink.core.state import PartMeta
from shardsink.errors import InvalidUsageError, ReadFrontierError


def prior_corrections(shard: Shard, lower: int, upper: int) -> list[PartMeta]:
    """The committed correction parts of ranges inside ``[lower, upper)``.

    Raises InvalidUsageError naming an earlier correction whose range partially overlaps.
    """
    out = []
    for b in shard.batches():
        for p in b.parts:
            r = p.corrected_range()
            if r is None or r[1] <= lower or r[0] >= upper:
                continue
            if r[0] < lower or r[1] > upper:
                raise InvalidUsageError(
                    f"re-processing [{lower}, {upper}) of {shard.url} partially overlaps the earlier correction of "
                    f"[{r[0]}, {r[1]}) (batch {b.desc_id}); re-process a range that contains it or avoids it"
                )
            out.append(p)
    return out


def check_range(shard: Shard, lower: int, upper: int, *, info: ShardInfo | None = None) -> None:
    """InvalidUsageError / ReadFrontierError unless ``[lower, upper)`` is sealed and readable.

    ``info``: the shard's head as the caller already read it (else read here)."""
    info = info if info is not None else shard.info()
    if upper <= lower:
        raise InvalidUsageError(f"re-processing range [{lower}, {upper}) is empty or reversed; expected A < B")
    if info.upper is None or upper > info.upper:
        raise InvalidUsageError(
            f"re-processing range [{lower}, {upper}) of {shard.url} is not sealed yet (shard upper {info.upper}); "
            "only past ranges below the upper can be re-processed"
        )
    if lower < info.since:
        raise ReadFrontierError(
            f"re-processing range [{lower}, {upper}) of {shard.url} starts below its since {info.since} "
            "(times before it were compacted)"
        )


def _millis(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidUsageError(f"{what} {value!r} is not a time")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, str) and value.strip():
        v = value.strip()
        if v.lstrip("-").isdigit():
            return int(v)
        try:
            dt = datetime.fromisoformat(v)
        except ValueError:
            raise InvalidUsageError(f"{what} {value!r} is neither milliseconds nor an ISO date/time") from None
        return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)
    raise InvalidUsageError(f"{what} {value!r} is neither milliseconds nor an ISO date/time")


def requested_range(params: Mapping[str, Any], *, interval: tuple[int | None, int | None]) -> tuple[int, int] | None:
    """The range a run's params / conf ask to re-process, or None.

    ``reprocess_from`` + ``reprocess_to`` (ms or ISO; UTC if no zone) name it; or
    ``reprocess: true`` re-processes the run's own data interval (for backfills with
    ``--reprocess-behavior completed``). Half a range is an InvalidUsageError.
    """
    a, b = params.get("reprocess_from"), params.get("reprocess_to")
    if a in (None, "") and b in (None, ""):
        if params.get("reprocess") in (True, "true", "True", 1):
            lo, hi = interval
            if lo is None or hi is None or hi <= lo:
                raise InvalidUsageError(f"reprocess=true needs a run with a data interval; got {interval}")
            return lo, hi
        return None
    if a in (None, "") or b in (None, ""):
        raise InvalidUsageError(f"re-processing needs both reprocess_from and reprocess_to; got {a!r} and {b!r}")
    return _millis(a, "reprocess_from"), _millis(b, "reprocess_to")
