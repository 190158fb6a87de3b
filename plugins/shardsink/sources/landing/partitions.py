"""A declared time-partitioned landing layout: which folders a window's run lists.

``LandingSource(root, partitions="dt=YYYY-MM-DD", lateness="2d")`` (or ``"YYYY/MM/DD"``) declares
that every data file sits under the folder of one UTC day directly below the root
(``root/dt=2026-11-27/...`` or ``root/2026/11/27/...``) and holds only event times of that day,
and that a file never lands in a day folder more than ``lateness`` older than the shard's upper.
A run for ``[lower, upper)`` then lists the day folders from ``lower - lateness`` to ``upper``
only (:func:`day_span`, :func:`day_prefixes`): what it lists does not grow with the zone's history.

Contract and hazards (docs/landing-zone.md):

* a file outside every day folder, or under a folder that names no valid day, is not data
  under this layout (not listed, never ingested);
* a file holding times outside its folder's day is refused (MalformedInputError naming the
  file, its day and its times: :func:`check_in_day`), since a run for a later window
  would not list that folder;
* a late file landed in a day folder older than ``upper - lateness`` is not seen, so it is
  neither ingested nor refused: the lateness horizon is the producer's promise. A late file
  within the horizon is refused as in a flat zone (:mod:`shardsink.sources.landing`).

A window wider than :data:`MAX_DAYS` days (a first run catching up a long history) lists the
whole zone once instead, keeping the files of the window's folders.
"""

from __future__ import annotations

import datetime as dt
import re

from shardsink.errors import InvalidUsageError
from shardsink.sources.landing.files import MalformedInputError

LAYOUTS: tuple[str, ...] = ("dt=YYYY-MM-DD", "YYYY/MM/DD")
DAY_MS = 86_400_000
#: More day folders than this in one run's window: list the whole zone once instead.
MAX_DAYS = 62
#: The widest lateness horizon accepted (ten years of day folders would defeat the layout).
MAX_LATENESS_MS = 3660 * DAY_MS
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": 7 * DAY_MS}
_DURATION = re.compile(r"(\d{1,12})(ms|s|m|h|d|w)", re.ASCII)
_FOLDER = {"dt=YYYY-MM-DD": re.compile(r"dt=(\d{4})-(\d{2})-(\d{2})/", re.ASCII),
           "YYYY/MM/DD": re.compile(r"(\d{4})/(\d{2})/(\d{2})/", re.ASCII)}
_EPOCH = dt.date(1970, 1, 1)


def check_layout(partitions: str | None, lateness: str | None) -> tuple[str | None, int]:
    """``(layout, lateness in ms)`` of a spec's ``partitions`` and ``lateness``; InvalidUsageError
    naming the value for an unknown layout, a malformed or out-of-range duration, or a lateness
    without a layout (it would mean nothing)."""
    if partitions is None:
        if lateness is not None:
            raise InvalidUsageError(f"landing lateness {lateness!r:.100} needs a partitioned layout "
                                    f"(partitions= one of {list(LAYOUTS)})", value=str(lateness)[:100])
        return None, 0
    if partitions not in LAYOUTS:
        raise InvalidUsageError(f"landing partitions {partitions!r:.100} is not a known layout; expected one of "
                                f"{list(LAYOUTS)}", value=str(partitions)[:100])
    if lateness is None:
        return partitions, DAY_MS
    m = _DURATION.fullmatch(lateness) if isinstance(lateness, str) else None
    if m is None:
        raise InvalidUsageError(f"landing lateness {lateness!r:.100} is not a duration; expected e.g. 2d, 36h, 90m, "
                                "0d", value=str(lateness)[:100])
    ms = int(m.group(1)) * _UNITS[m.group(2)]
    if ms > MAX_LATENESS_MS:
        raise InvalidUsageError(f"landing lateness {lateness!r} is out of range; expected at most "
                                f"{MAX_LATENESS_MS // DAY_MS}d", value=lateness)
    return partitions, ms


def folder(layout: str, day: dt.date) -> str:
    """The folder (a key prefix ending in ``/``) of ``day`` under ``layout``."""
    if layout == "dt=YYYY-MM-DD":
        return f"dt={day.isoformat()}/"
    return f"{day.year:04d}/{day.month:02d}/{day.day:02d}/"


def day_of_key(layout: str, key: str) -> dt.date | None:
    """The day folder ``key`` sits under, or None (not data under ``layout``)."""
    m = _FOLDER[layout].match(key)
    if m is None:
        return None
    try:
        return dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return None


def _day(ms: int) -> dt.date | None:
    try:
        return _EPOCH + dt.timedelta(days=ms // DAY_MS)
    except OverflowError:
        return None


def day_span(lateness_ms: int, lower: int, upper: int) -> tuple[dt.date, dt.date] | None:
    """The first and last day a run for ``[lower, upper)`` lists (the days of ``[lower - lateness,
    upper)``), or None when they fall outside the calendar (list the zone once)."""
    first = _day(max(lower - lateness_ms, -(2**62)))
    last = _day(max(upper - 1, lower))
    return (first, last) if first is not None and last is not None else None


def day_prefixes(layout: str, span: tuple[dt.date, dt.date] | None) -> list[str] | None:
    """The folders of the days of ``span``, oldest first; None when there are more than
    :data:`MAX_DAYS` (or no span): list the zone once and keep :func:`in_span` keys."""
    if span is None or (span[1] - span[0]).days + 1 > MAX_DAYS:
        return None
    return [folder(layout, span[0] + dt.timedelta(days=i)) for i in range((span[1] - span[0]).days + 1)]


def in_span(layout: str, key: str, span: tuple[dt.date, dt.date] | None) -> bool:
    """Whether ``key`` sits in a day folder (of ``span``'s days, if given)."""
    day = day_of_key(layout, key)
    return day is not None and (span is None or span[0] <= day <= span[1])


def check_in_day(layout: str, key: str, tmin: int, tmax: int, *, root: str) -> None:
    """MalformedInputError unless every event time of ``key`` (``[tmin, tmax]``) lies in its day."""
    day = day_of_key(layout, key)
    if day is None:
        return
    start = (day - _EPOCH).days * DAY_MS
    if tmin < start or tmax >= start + DAY_MS:
        raise MalformedInputError(
            f"{root}/{key} holds event times [{tmin}, {tmax}] outside its day folder {day.isoformat()} "
            f"([{start}, {start + DAY_MS})); under the partitions={layout!r} layout a file holds only its "
            "day's times (a later run would not list its folder). Move its rows to their days' folders.",
            value=key)
