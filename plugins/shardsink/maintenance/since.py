"""Advancing ``since`` by retention and leases, and setting a shard's retention.

``since = min(upper − retention, min as_of of live leases)``, never backwards, never past
``upper - 1`` while the shard is open. The rule is the pure
:func:`shardsink.core.transitions.advance_since`; this module gathers its inputs.

Lease contract (core/leases.py): the live leases are listed immediately before the
conditional put, and ``since`` never passes the lowest ``as_of`` among them. A lease
written after the listing is protected by the reader's own re-check (``leases.acquire``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from shardsink.core import checks as ck
from shardsink.core import leases
from shardsink.core import state as st
from shardsink.core.commands import RetentionCommand, SinceCommand
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(text: str | int | timedelta | None) -> int | None:
    """Milliseconds from ``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"500ms"``, ``"2w"``, an int
    (ms) or a timedelta; ``None``/``"none"``/``"forever"`` mean keep all history."""
    if text is None:
        return None
    if isinstance(text, timedelta):
        ms = int(text.total_seconds() * 1000)
    elif isinstance(text, int) and not isinstance(text, bool):
        ms = text
    elif isinstance(text, str) and text.strip().lower() in ("none", "forever", "all"):
        return None
    elif isinstance(text, str) and (m := _DURATION.match(text.lower())):
        ms = int(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise InvalidUsageError(
            f"retention {text!r} is not a duration; expected e.g. 7d, 12h, 30m, 45s, 500ms, 2w, or 'none'"
        )
    if ms < 1:
        raise InvalidUsageError(f"retention {text!r} must be at least 1 ms (or 'none' to keep all history)")
    return ck.check_duration_ms(ms, what=f"retention {text!r} =")


def format_duration(ms: int | None) -> str:
    if ms is None:
        return "none (all history)"
    for unit in ("w", "d", "h", "m", "s"):
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class SinceResult:
    """``before``/``after``: since before and after; ``seqno`` of the version written (None:
    unchanged); ``lease_cap``: the lowest leased as_of seen (None: no live lease)."""

    before: int
    after: int
    seqno: int | None
    lease_cap: int | None

    def render(self) -> str:
        """For operators: ``0 → 5 (version 12), lowest lease at 3``."""
        held = f", lowest lease at {self.lease_cap}" if self.lease_cap is not None else ""
        return f"{self.before} → {self.after}{f' (version {self.seqno})' if self.seqno is not None else ''}{held}"


def advance_since(shard: Shard, *, target: int | None = None, writer: str | None = None,
                  now: float | None = None) -> SinceResult:
    """Advance ``since`` as far as retention, live leases and ``target`` allow (one commit).

    With no retention set and no ``target``, nothing moves.
    """
    if target is not None:
        ck.check_time(target, what="since target")
    if writer is not None:
        ck.check_writer(writer)
    admin = shard.admin()
    before = admin.head().header.since
    cap = leases.min_leased_as_of(shard, now=now)  # immediately before the conditional put
    out = admin.commit(SinceCommand(cap, target), writer=writer)
    if isinstance(out, st.Version):
        return SinceResult(before, out.header.since, out.seqno, cap)
    return SinceResult(before, admin.head().header.since, None, cap)


def set_retention(shard: Shard, retention: str | int | timedelta | None, *, writer: str | None = None) -> bool:
    """Set the shard's retention (committed state transition); False if it already was that."""
    ms = parse_duration(retention)
    if writer is not None:
        ck.check_writer(writer)
    out = shard.admin().commit(RetentionCommand(ms), writer=writer)
    return isinstance(out, st.Version)


def retention_of(shard: Shard) -> int | None:
    """The shard's retention in ms (None: all history)."""
    return shard.admin().head().header.retention
