"""Range and type checks of every value a caller hands the library: one definition each.

Every public entry point (the CLI's parsers, :class:`shardsink.core.shard.Shard`, leases,
maintenance, the DAG factories) checks its arguments with these before it reads or
writes anything, so a bad value is refused with :class:`InvalidUsageError` (CLI exit 2)
naming the value and the allowed range, and nothing is written.

The ranges:

==================  =========================================================================
time                an integer (not a bool) in ``[0, TIME_MAX]``: int64 milliseconds since
                    the epoch; shard times are never negative (a shard starts at upper >= 0)
upper (exclusive)   a time; ``TIME_MAX`` itself is a valid upper (times up to ``TIME_MAX - 1``)
duration (ms)       an integer in ``[1, TIME_MAX]`` (retention): ``upper - retention`` stays in int64
duration (s)        a finite float in ``[0, SECONDS_MAX]`` (grace, lease TTL, settle, backoff)
count               an integer in ``[lo, COUNT_MAX]`` (limits, writers, attempts, spans of slots)
writer              1 to ``WRITER_MAX`` printable characters (no control characters or escapes)
description id      1 to 128 ASCII letters, digits or ``-_.=+``; not ``.`` or ``..``
==================  =========================================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shardsink.core.commits import Listing
from shardsink.errors import InvalidUsageError, ReadFrontierError

if TYPE_CHECKING:
    from shardsink.core.state import Header

#: The largest int64: the highest time an upper may name (times are int64 milliseconds).
TIME_MAX = 2**63 - 1
#: The longest duration in seconds any option accepts (about 100 years).
SECONDS_MAX = 100 * 366 * 86400.0
#: The largest count any option accepts (limits, slots, attempts).
COUNT_MAX = 2**31 - 1
#: The longest writer name: the header keeps the last 64 distinct writers, so it stays bounded.
WRITER_MAX = 1024
#: The longest description id (it becomes an object key segment).
DESC_ID_MAX = 128
#: A valid description id (every id but ``.`` and ``..`` it matches passes the checks below).
_DESC_ID = re.compile(rf"[A-Za-z0-9_.=+-]{{1,{DESC_ID_MAX}}}")


def is_int(x: object) -> bool:
    """An integer that is not a bool (``True`` is not the time 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_time(value: object, *, what: str = "time") -> int:
    """``value`` as a time: an integer in ``[0, TIME_MAX]``."""
    if not is_int(value):
        raise InvalidUsageError(f"{what} {value!r} is not an integer; expected milliseconds in [0, {TIME_MAX}]",
                                value=value)
    assert isinstance(value, int)
    if not 0 <= value <= TIME_MAX:
        raise InvalidUsageError(f"{what} {value} is out of range; expected milliseconds in [0, {TIME_MAX}] (int64)",
                                value=value)
    return value


def check_bounds(lower: object, upper: object) -> None:
    """``[lower, upper)`` of a batch: two times with ``lower < upper``; ``upper`` None closes the shard."""
    if not is_int(lower) or (upper is not None and not is_int(upper)):
        raise InvalidUsageError(f"bounds must be integers, got lower={lower!r} upper={upper!r}")
    check_time(lower, what="lower")
    if upper is None:
        return
    check_time(upper, what="upper")
    assert isinstance(lower, int) and isinstance(upper, int)
    if upper <= lower:
        raise InvalidUsageError(f"batch bounds [{lower}, {upper}) are empty or reversed; expected lower < upper")


def check_duration_ms(value: object, *, what: str) -> int:
    """A duration in milliseconds (retention): an integer in ``[1, TIME_MAX]``."""
    if not is_int(value):
        raise InvalidUsageError(f"{what} {value!r} is not an integer number of milliseconds", value=value)
    assert isinstance(value, int)
    if not 1 <= value <= TIME_MAX:
        raise InvalidUsageError(f"{what} {value} ms is out of range; expected 1 to {TIME_MAX} ms", value=value)
    return value


def check_seconds(value: object, *, what: str, positive: bool = False) -> float:
    """A duration in seconds: finite, ``>= 0`` (``> 0`` if ``positive``) and at most ``SECONDS_MAX``.

    SUBTLE: NaN compares false with everything, so ``nan < 0`` is False: a check written
    as ``if value < 0: refuse`` lets NaN through, and NaN then behaves as 0 in ``now - nan``
    comparisons (``gc --grace nan`` deleted a one-second-old part). Check finiteness first.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidUsageError(f"{what} {value!r} is not a number of seconds", value=value)
    f = float(value)
    low = "> 0" if positive else ">= 0"
    if not math.isfinite(f) or f < 0 or (positive and f == 0) or f > SECONDS_MAX:
        raise InvalidUsageError(f"{what} {value!r} is out of range; expected finite seconds {low} and at most "
                                f"{SECONDS_MAX:.0f}", value=value)
    return f


def check_count(value: object, *, what: str, lo: int = 0) -> int:
    """An integer count in ``[lo, COUNT_MAX]``."""
    if not is_int(value):
        raise InvalidUsageError(f"{what} {value!r} is not an integer", value=value)
    assert isinstance(value, int)
    if value < lo:
        raise InvalidUsageError(f"{what} {value} must be at least {lo}", value=value)
    if value > COUNT_MAX:
        raise InvalidUsageError(f"{what} {value} is out of range; expected at most {COUNT_MAX}", value=value)
    return value


def check_writer(value: object) -> str:
    """A writer name: 1 to ``WRITER_MAX`` printable characters (no control characters, no ANSI escapes)."""
    if not isinstance(value, str):
        raise InvalidUsageError(f"writer {value!r} is not a string", value=value)
    if not 1 <= len(value) <= WRITER_MAX:
        raise InvalidUsageError(f"writer name of {len(value)} characters is refused; expected 1 to {WRITER_MAX}",
                                value=value[:80])
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise InvalidUsageError(f"writer {value[:80]!r} contains the non-printable character {bad!r}; expected "
                                "printable characters only", value=value[:80])
    return value


def check_desc_id(desc_id: object) -> str:
    """A description id: 1 to 128 ASCII letters, digits or ``-_.=+``; not ``.`` or ``..``.

    ASCII only: the id becomes an object key segment (:func:`shardsink.storage.base.check_key`).
    """
    if not isinstance(desc_id, str):
        raise InvalidUsageError(f"description id {desc_id!r} is not a string", value=desc_id)
    if _DESC_ID.fullmatch(desc_id) and desc_id not in (".", ".."):
        return desc_id
    if (not desc_id or len(desc_id) > DESC_ID_MAX
            or not all((c.isascii() and c.isalnum()) or c in "-_.=+" for c in desc_id)):
        raise InvalidUsageError(
            f"description id {desc_id[:200]!r} is invalid; expected 1-{DESC_ID_MAX} letters, digits or -_.=+"
        )
    if desc_id in (".", ".."):
        raise InvalidUsageError(f"description id {desc_id!r} is invalid")
    return desc_id


def check_props(props: object) -> Mapping[str, str]:
    """Commit props: a mapping of strings to strings (None: no props)."""
    if props is None:
        return {}
    if not isinstance(props, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise InvalidUsageError(f"props {props!r:.200} must map strings to strings")
    return props


#: The most inputs a listing may record as held at or after its time (a commit record carries them).
LISTING_HELD_MAX = 10_000
#: The latest listing time a commit accepts (year 9999, epoch seconds).
LISTING_AT_MAX = 253_402_300_799.0


def check_listing(listing: object) -> None:
    """A source listing recorded on an append (:class:`shardsink.core.commits.Listing`, or None):
    a finite time in ``[0, year 9999]``, at most :data:`LISTING_HELD_MAX` held inputs, each a
    non-empty key of at most 1,024 characters that appeared at or after the listing's time."""
    if listing is None:
        return
    if not isinstance(listing, Listing):
        raise InvalidUsageError(f"listing {listing!r:.200} must be a shardsink.core.commits.Listing")
    at = listing.at
    if not isinstance(at, int | float) or isinstance(at, bool) or not 0 <= at <= LISTING_AT_MAX:
        raise InvalidUsageError(f"listing time {at!r} must be epoch seconds in [0, {LISTING_AT_MAX:.0f}]",
                                value=repr(at)[:100])
    if len(listing.held) > LISTING_HELD_MAX:
        raise InvalidUsageError(f"listing holds {len(listing.held)} inputs that appeared at or after its time; "
                                f"at most {LISTING_HELD_MAX}", value=len(listing.held))
    for key, appeared in listing.held:
        if not isinstance(key, str) or not key or len(key) > 1024:
            raise InvalidUsageError(f"listing's held input key {key!r:.200} must be 1 to 1,024 characters",
                                    value=repr(key)[:200])
        if not isinstance(appeared, int | float) or isinstance(appeared, bool) or not at <= appeared <= LISTING_AT_MAX:
            raise InvalidUsageError(f"listing's held input {key!r:.200} appeared at {appeared!r}, not at or after "
                                    f"the listing's time {at}", value=repr(appeared)[:100])


def as_table(table: object, *, what: str = "table") -> Any:
    """A ``pyarrow.Table`` from a table, a record batch, or a mapping of column name to values.

    Anything else is refused with InvalidUsageError, before any use (a plain dict would
    otherwise fail later with AttributeError).
    """
    import pyarrow as pa

    if isinstance(table, pa.Table):
        return table
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    if isinstance(table, Mapping):
        if not all(isinstance(k, str) for k in table):
            raise InvalidUsageError(f"{what}: column names must be strings, got {list(table)[:10]!r}")
        try:
            return pa.table(dict(table))
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise InvalidUsageError(f"{what}: the mapping of columns is not a table: {e}") from e
    raise InvalidUsageError(f"{what} must be a pyarrow.Table, a RecordBatch or a mapping of columns, "
                            f"got {type(table).__name__}")


def _read_time(value: object, *, what: str) -> int:
    """A time a read names: an integer up to ``TIME_MAX`` (one below 0 is before every since:
    the frontier check that follows refuses it with ReadFrontierError)."""
    if not is_int(value):
        raise InvalidUsageError(f"{what} {value!r} is not an integer; expected milliseconds in [0, {TIME_MAX}]",
                                value=value)
    assert isinstance(value, int)
    if value > TIME_MAX:
        raise InvalidUsageError(f"{what} {value} is out of range; expected milliseconds in [0, {TIME_MAX}] (int64)",
                                value=value)
    return value


def check_as_of(url: str, h: Header, as_of: object) -> int:
    """ReadFrontierError unless ``as_of`` is a time with ``since <= as_of < upper`` (any as_of >= since once closed)."""
    t = _read_time(as_of, what="as_of")
    if t < h.since or (h.upper is not None and t >= h.upper):
        raise ReadFrontierError(
            f"as_of {t} is not readable on {url}: expected since ({h.since}) <= as_of < upper ({h.upper})"
        )
    return t


def check_changes(url: str, h: Header, lower: object, upper: object) -> None:
    """InvalidUsageError / ReadFrontierError unless ``since <= lower <= upper <= shard upper`` (all times)."""
    lo, hi = _read_time(lower, what="changes from"), _read_time(upper, what="changes to")
    if hi < lo:
        raise InvalidUsageError(f"changes bounds [{lo}, {hi}) are reversed; expected from <= to")
    if lo < h.since:
        raise ReadFrontierError(f"changes from {lo} is before since {h.since} on {url}")
    if h.upper is not None and hi > h.upper:
        raise ReadFrontierError(
            f"changes to {hi} is beyond upper {h.upper} on {url}; times >= upper are not sealed yet"
        )
