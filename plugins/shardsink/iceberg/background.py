"""The view's upkeep off the committing call's critical path: one background worker per process.

Core's after-commit hook (:func:`shardsink.iceberg.keeper.upkeep`) costs a few store round trips
(the manifests and manifest list, then the metadata file) that the append does not need: the view
is derived and never consulted for correctness. So by default (mode ``"background"``) the hook only
queues the committed version (:meth:`Upkeeper.submit`) and the committing call returns; one daemon
thread per process runs the upkeep. Mode ``"inline"`` runs it in the committing call, as before:
the deterministic simulator uses it (a worker thread would race its baton and break replay), and so
do tests that assert the view right after a commit. The mode is injected
(:meth:`Upkeeper.using`, :meth:`Upkeeper.set_mode`), never read from the environment.

Contracts:

* **Coalescing.** The queue holds one entry per shard url: the newest version committed there.
  Commits that queue up behind a busy worker are done by one catch-up to the newest version (the
  upkeep finds no view of the version before it and catches up as ``sync`` does, from the newest
  metadata file). The final view is the same as inline mode's: every object is named by the shard
  version and created conditionally.
* **Bounded.** At most :data:`MAX_SHARDS` shards wait; a commit to one more shard waits for room
  (back-pressure, never a dropped upkeep).
* **Flush.** :meth:`Upkeeper.flush` waits until every queued upkeep is done. It runs at normal
  interpreter exit, and whoever ends a unit of work that committed calls it through core's
  :func:`shardsink.core.after_commit.drain` (an Airflow shard task before it reports success, the
  CLI before it returns its exit code).
* **Errors** of an upkeep are logged, never raised into a later call, and never affect the shard:
  the view stays behind until the next commit of that shard or ``shardsink iceberg sync``. A crash
  (or ``os._exit`` without a flush) loses only queued upkeeps: the view is behind, never wrong.

SUBTLE: the upkeep runs in the committing call's :mod:`contextvars` context (copied at submit): S3
credentials set with ``using_s3_access`` for a block (an Airflow task's connection) are a context
variable, which a worker thread would not see otherwise.
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from shardsink.core.after_commit import Committed

log = logging.getLogger("shardsink.iceberg")
Mode = Literal["background", "inline"]
#: Shards whose upkeep may wait at once (one entry each, coalesced); one more waits for room.
MAX_SHARDS = 64
#: How long the exit flush waits (seconds); past it the view stays behind until the next commit or sync.
EXIT_TIMEOUT = 120.0


class Upkeeper:
    """Runs ``run`` (the upkeep of one committed version) inline or on a daemon worker, coalesced
    per shard url (see the module docstring). ``run`` is a public attribute: tests wrap it to order
    events (block the worker on an event), never to change what it writes."""

    def __init__(self, run: Callable[[Committed], None], *, mode: Mode = "background",
                 max_shards: int = MAX_SHARDS) -> None:
        self.run = run
        self._mode: Mode = mode
        self._max = max_shards
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """Empty state. SUBTLE: also in a forked child (Celery, Airflow's task supervisor fork):
        the parent's worker thread does not exist there and its lock may have been held at the fork;
        the parent's queued upkeeps are the parent's to do."""
        self._cond = threading.Condition()
        self._pending: OrderedDict[str, tuple[Committed, contextvars.Context]] = OrderedDict()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._exit_pid = -1

    @property
    def mode(self) -> Mode:
        return self._mode

    def set_mode(self, mode: Mode) -> Mode:
        """Use ``mode`` from now on (after flushing what is queued); returns the mode it replaced."""
        if mode not in ("background", "inline"):
            raise ValueError(f"upkeep mode must be 'background' or 'inline', not {mode!r}")
        self.flush()
        before, self._mode = self._mode, mode
        return before

    @contextmanager
    def using(self, *, mode: Mode) -> Iterator[None]:
        """Use ``mode`` within the block; what the block queued is flushed on exit, also after an
        error, and the mode it replaced is restored."""
        before = self.set_mode(mode)
        try:
            yield
        finally:
            self.set_mode(before)

    def submit(self, c: Committed) -> None:
        """Core's after-commit hook: the upkeep of ``c``, inline or queued (coalesced with an
        upkeep of the same shard still waiting). Never raises."""
        if self._mode == "inline":
            self._guarded(c)
            return
        ctx = contextvars.copy_context()
        with self._cond:
            # SUBTLE: back-pressure; the worker makes room (a new url only: the same url coalesces)
            self._cond.wait_for(lambda: len(self._pending) < self._max or c.url in self._pending)
            old = self._pending.get(c.url)
            if old is None or old[0].version.seqno < c.version.seqno:
                self._pending[c.url] = (c, ctx)
            self._start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued upkeep is done (at most ``timeout`` seconds; None: no limit);
        False when it timed out. Called from the worker itself (an upkeep that commits), it cannot
        wait for itself: False at once."""
        if threading.current_thread() is self._thread:
            return False
        with self._cond:
            done = self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)
        if not done:
            log.warning("Iceberg upkeep not done within %s s; the views are behind until the next commit or sync",
                        timeout)
        return done

    def _start(self) -> None:
        """Start the worker (and the exit flush) in this process if not yet; called under the lock."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._work, name="shardsink-iceberg-upkeep", daemon=True)
        self._thread.start()
        if self._exit_pid != os.getpid():
            self._exit_pid = os.getpid()
            # SUBTLE: two exits. A normal interpreter exit runs threading's exit hooks first (before
            # concurrent.futures refuses new work, which the upkeep's parallel writes need), then
            # atexit; a process ended by atexit's functions then os._exit (Airflow's forked task
            # runner) runs only atexit. The second flush finds nothing left.
            register = getattr(threading, "_register_atexit", None)
            if register is not None:
                register(self._exit_flush)
            atexit.register(self._exit_flush)

    def _exit_flush(self) -> None:
        self.flush(EXIT_TIMEOUT)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                _, (c, ctx) = self._pending.popitem(last=False)
                self._busy += 1
                self._cond.notify_all()  # room in the queue
            try:
                ctx.run(self._guarded, c)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _guarded(self, c: Committed) -> None:
        """The upkeep of ``c``; an error is logged, never raised (derived, never in the way)."""
        try:
            self.run(c)
        except Exception as e:
            log.warning("%s: Iceberg upkeep failed at seqno %d (%s: %s); the view is behind until the next "
                        "commit or `shardsink iceberg sync`", c.url, c.version.seqno, type(e).__name__, e)
