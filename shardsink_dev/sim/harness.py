"""What the simulator injects into the unmodified library while a schedule runs, and takes back after.

* **the store**: ``s3://<bucket>/...`` of the world's buckets open the in-memory store
  (:func:`shardsink.storage.url.serve`), behind the same :class:`~shardsink.storage.retry.RetryingBlob`
  as every store, whose policy sleeps in simulated time (the clock advances by the wait);
* **the clock**: commits are stamped by the simulated clock (``shardsink.core.machine.now_iso``, the
  one place the commit machine reads the wall clock; tests already pin it the same way); every
  other clock the paths under test read is a parameter the world passes (GC's, verify's, leases',
  the append's turn, the sweep's ``now``);
* **the randomness**: ``uuid.uuid4`` (part keys, nonces, description and compaction ids) and the
  ``random`` module (retry jitter) are seeded from the schedule's seed;
* **concurrency**: the library's thread pools (parallel GETs of versions and parts, verify's
  checks) run their maps inline in the calling actor's thread, so every request is one the
  scheduler orders (a pool thread would race the baton and break replay);
* Arrow uses one CPU thread (the simulator runs thousands of tiny reads, whose thread hand-offs
  cost more than they read), and the library's log lines below ERROR are silenced.

Contract: :func:`injected` restores every one of these on exit, also after a failure.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa

import shardsink.core.machine as machine_mod
import shardsink.core.part_io as part_io_mod
import shardsink.core.version_store as version_store_mod
import shardsink.maintenance.merge as merge_mod
import shardsink.maintenance.verify as verify_mod
from shardsink.storage.retry import STORAGE, RetryingBlob
from shardsink.storage.url import ShardUrl, serve
from shardsink_dev.sim.store import MemBlob, World

T = TypeVar("T")

#: The modules whose ``ThreadPoolExecutor`` runs inline under the simulator.
POOLED = (part_io_mod, version_store_mod, merge_mod, verify_mod)


class InlinePool:
    """A ``ThreadPoolExecutor`` whose ``map`` runs in the caller's thread, in order (lazily, as
    the pool's results are consumed)."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max_workers

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any]) -> Iterator[T]:
        return map(fn, *iterables)


def sim_sleep(world: World) -> Callable[[float], None]:
    """A retry policy's sleep that waits in simulated time."""
    return world.clock.advance


def open_sim_blob(world: World, u: ShardUrl) -> RetryingBlob:
    """The store :func:`shardsink.storage.url.open_blob` returns for a served bucket."""
    return RetryingBlob(MemBlob(world, u.bucket, u.path), policy=STORAGE.with_sleep(sim_sleep(world)))


@contextmanager
def injected(world: World, seed: int, buckets: Iterable[str]) -> Iterator[None]:
    """Serve ``buckets`` from ``world`` and inject its clock and ``seed`` (see the module docstring)."""
    ids = random.Random(seed ^ 0x5EED)
    saved_random = random.getstate()
    saved = (uuid.uuid4, machine_mod.now_iso, [m.ThreadPoolExecutor for m in POOLED], pa.cpu_count())  # type: ignore[attr-defined]
    log = logging.getLogger("shardsink")
    level = log.level
    names = list(buckets)
    try:
        uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
        random.seed(seed)
        machine_mod.now_iso = lambda: datetime.fromtimestamp(world.clock.now, UTC).isoformat(timespec="milliseconds")
        for m in POOLED:
            m.ThreadPoolExecutor = InlinePool  # type: ignore[attr-defined]
        pa.set_cpu_count(1)
        log.setLevel(logging.ERROR)
        for b in names:
            serve(b, lambda u: open_sim_blob(world, u))
        yield
    finally:
        for b in names:
            serve(b, None)
        uuid.uuid4, machine_mod.now_iso = saved[0], saved[1]
        for m, pool in zip(POOLED, saved[2], strict=True):
            m.ThreadPoolExecutor = pool  # type: ignore[attr-defined]
        pa.set_cpu_count(saved[3])
        random.setstate(saved_random)
        log.setLevel(level)
