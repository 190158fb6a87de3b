"""A description's writer slots stop together: the one that fails for good cancels the others.

The writer slots of a description are separate Airflow tasks (mapped instances, possibly on
different workers), each running its own spark-submit. Once one of them fails for good (not
retried: invalid input, corruption, a configuration error, or its last try), the attempt's
append can never run, so its siblings' Spark applications only burn executors. The failed
slot records it in the shard's store, at ``cancel/<desc_id>/<generation>.json``
(:class:`SlotFailure`); every slot of that description looks for it before it starts its
JVM, and polls it while its spark-submit runs (:meth:`SlotCancels.watching`), killing the
application when it appears. The store is the one place every worker reaches.

``generation``: the DAG run's clear number. Clearing the run's tasks to try them again starts
a new generation, so a failure recorded before the clear does not cancel the new tries.

Contract: a marker is advisory. It never deletes anything and never decides a fate: a
cancelled slot stages nothing more, its description cannot commit without it, and what it
staged goes the way of any dead writer's (the fate primitive, GC). A marker that cannot be
read or decoded cancels nothing (logged). Markers are a registered root folder that GC
expires after its grace period (:func:`shardsink.core.roots.register_root`); importing this
module registers it (GC and verify do).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import msgspec

from shardsink.core.checks import check_desc_id
from shardsink.core.roots import RootObjects, register_root
from shardsink.errors import InvalidUsageError, ShardsinkError
from shardsink.storage.retry import RetryPolicy

log = logging.getLogger("shardsink.sinks")

CANCEL_PREFIX = "cancel/"
FORMAT = "shardsink.slot-failure/1"
#: Seconds between two looks of a running slot for a sibling's failure (one GET each).
POLL_S = 5.0
#: Recording or reading a marker is best effort: a short policy, never the store's full one.
_POLICY = RetryPolicy("slot-cancel", attempts=2, first_wait=0.2, max_wait=1.0, deadline=10.0)

register_root(CANCEL_PREFIX, owner="sinks.cancel", prefix=True, expiry="after_grace")


class SlotFailure(msgspec.Struct, frozen=True, kw_only=True):
    """Slot ``slot`` of description ``desc_id`` failed for good in run generation ``generation``."""

    format: str = FORMAT
    desc_id: str
    generation: int
    slot: int
    reason: str
    at: str


_decoder = msgspec.json.Decoder(SlotFailure)


def marker_key(desc_id: str, generation: int) -> str:
    """Where a failure of ``desc_id``'s slots in ``generation`` is recorded."""
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation < 2**31:
        raise InvalidUsageError(f"generation {generation!r:.60} is not a clear number (an int in [0, 2^31))",
                                value=str(generation)[:60])
    return f"{CANCEL_PREFIX}{check_desc_id(desc_id)}/{generation}.json"


class SlotCancels:
    """The failure marker of one description's slots in one run generation, in the shard at ``shard_url``.

    SUBTLE: build it where the store's credentials are in effect (``store_access``): its client
    keeps them, also in the watching thread, which a context variable would not reach."""

    def __init__(self, shard_url: str, desc_id: str, *, generation: int) -> None:
        self.key = marker_key(desc_id, generation)
        self.desc_id, self.generation = desc_id, generation
        self._roots = RootObjects(shard_url, policy=_POLICY)

    def failure(self) -> SlotFailure | None:
        """The recorded failure, or None (none yet, or unreadable: logged, cancels nothing)."""
        try:
            data = self._roots.get(self.key)
        except ShardsinkError as e:
            log.warning("cannot read %s (%s); looking again later", self._roots.where(self.key), e)
            return None
        if data is None:
            return None
        try:
            got = _decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("ignoring %s: not a slot failure record (%s)", self._roots.where(self.key), e)
            return None
        return got if (got.desc_id, got.generation) == (self.desc_id, self.generation) else None

    def record(self, slot: int, reason: str) -> None:
        """Record that ``slot`` failed for good (a plain put: any failed slot's reason will do).
        Best effort: a store that cannot take it is logged; the siblings then run to their end."""
        doc = SlotFailure(desc_id=self.desc_id, generation=self.generation, slot=slot, reason=reason[:2000],
                          at=datetime.now().astimezone().isoformat(timespec="milliseconds"))
        try:
            self._roots.put(self.key, msgspec.json.encode(doc))
            log.info("slot %d failed for good: its siblings' Spark applications are cancelled (%s)", slot,
                     self._roots.where(self.key))
        except ShardsinkError as e:
            log.warning("could not record the failure of slot %d at %s (%s); its siblings run to their end",
                        slot, self._roots.where(self.key), e)

    @contextmanager
    def watching(self, on_failure: Callable[[SlotFailure], None], *, every: float = POLL_S) -> Iterator[None]:
        """Run the block while a thread looks for the failure every ``every`` seconds; once it is
        there, ``on_failure(it)`` is called at every look until the block ends (so a callback
        that found nothing to kill yet, e.g. a process not started, gets another chance)."""
        stop = threading.Event()
        seen: list[SlotFailure] = []

        def watch() -> None:
            while not stop.wait(every):
                if not seen and (got := self.failure()) is not None:
                    seen.append(got)
                if seen:
                    try:
                        on_failure(seen[0])
                    except Exception:  # the watcher must not die silently: the slot would run on
                        log.exception("cancelling after the failure at %s failed; trying again",
                                      self._roots.where(self.key))

        t = threading.Thread(target=watch, name=f"shardsink-cancel-{self.desc_id}", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(timeout=every + 30)


def cancelled_message(failed: SlotFailure, slot: int) -> str:
    """Why slot ``slot`` stopped (the task's failure, not retried)."""
    return (f"cancelled, not retried: slot {failed.slot} of description {failed.desc_id} failed for good, so this "
            f"attempt cannot commit; slot {slot} stops its Spark application. Slot {failed.slot}: {failed.reason}")
