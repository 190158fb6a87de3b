"""The wall clock core reads: the time a commit is stamped with (:func:`shardsink.core.machine.now_iso`).

Every other clock core reads is a parameter of the call or handle that reads it (the known-head
age, leases', GC's, verify's). A commit's stamp is read deep inside the commit loop of every handle,
those the library opens for itself included, so its clock is this one public hook, :data:`WALL`:
``time.time`` unless a caller installs another for a block with :meth:`WallClock.using` (the
deterministic simulator stamps commits with its simulated clock; a test may pin a commit's time).

Contract: :meth:`WallClock.using` restores the clock it replaced on exit, also after an error. The
hook is process-wide, not per thread: install it around work that owns the process (a simulated
schedule, a test), never around one request among concurrent ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime


class WallClock:
    """Epoch seconds now (:meth:`now`), and as a commit's ISO 8601 stamp (:meth:`iso`)."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()

    def iso(self) -> str:
        """Now as ISO 8601, UTC, milliseconds (``2026-11-28T15:30:00.123+00:00``)."""
        return datetime.fromtimestamp(self._now(), UTC).isoformat(timespec="milliseconds")

    @contextmanager
    def using(self, now: Callable[[], float]) -> Iterator[None]:
        """Read ``now`` (epoch seconds) instead within the block."""
        before, self._now = self._now, now
        try:
            yield
        finally:
            self._now = before


#: The wall clock of every commit stamp in this process.
WALL = WallClock()
