"""What the simulator injects into the unmodified library while a schedule runs, and takes back after.

* **the store**: ``s3://<bucket>/...`` of the world's buckets open the in-memory store
  (:func:`shardsink.storage.url.serve`), behind the same :class:`~shardsink.storage.retry.RetryingBlob`
  as every store, whose policy sleeps in simulated time (the clock advances by the wait);
* **the clock**: commits are stamped by the simulated clock, installed in core's public wall-clock
  hook (:data:`shardsink.core.clock.WALL`, the one clock the commit machine reads that no caller
  passes); every other clock the paths under test read is a parameter the world passes (GC's,
  verify's, leases', the append's turn, the sweep's ``now``);
* **the randomness**: ``uuid.uuid4`` (part keys, nonces, description and compaction ids) and the
  ``random`` module (retry jitter) are seeded from the schedule's seed;
* **concurrency**: the library's thread pools (parallel GETs of versions and parts, verify's
  checks) run their maps inline in the calling actor (its greenlet), so every request is one the
  scheduler orders (a pool thread would race the baton and break replay); for the same reason the
  Iceberg view's upkeep runs inline in the committing actor (``UPKEEP.using(mode="inline")``), not
  on its background worker;
* **memory**: each actor is a process of its own, so what the library keeps in a process's memory
  (the Iceberg view's last written view, :mod:`shardsink.iceberg.keeper`) is the actor's own:
  swapped in whenever the actor takes the baton (:func:`per_process`);
* Arrow uses one CPU thread (the simulator runs thousands of tiny reads, whose thread hand-offs
  cost more than they read), and the library's log lines below ERROR are silenced;
* Python's cyclic garbage collector runs less often (:data:`GC_THRESHOLDS`): a schedule allocates
  hundreds of thousands of short-lived objects, and at the default thresholds its collections
  (about a thousand a hundred schedules, many of them passes over the whole heap) took 4-5% of the
  CPU. No object the schedule depends on has a finalizer: a schedule's actors are unwound
  explicitly (:meth:`shardsink_dev.sim.sched.Scheduler.run`), not collected.

Contract: :func:`injected` restores every one of these on exit, also after a failure.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import random
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

import pyarrow as pa

import shardsink.iceberg.keeper as keeper_mod
from shardsink.core.clock import WALL
from shardsink.iceberg import UPKEEP
from shardsink.storage.retry import STORAGE, RetryingBlob, RetryPolicy
from shardsink.storage.url import ShardUrl, serve
from shardsink_dev.sim.store import MemBlob, World

T = TypeVar("T")

_POOL = concurrent.futures.ThreadPoolExecutor
#: The collector's thresholds while a schedule runs (Python's defaults: 700, 10, 10).
GC_THRESHOLDS = (5000, 20, 100)


class InlinePool:
    """A ``ThreadPoolExecutor`` that runs its work in the caller's thread, in order: ``map``
    lazily, as the pool's results are consumed; ``submit`` at once, into a finished future (an
    Exception is kept in it; a crash or a violation goes through, as it would stop the process)."""

    def __init__(self, max_workers: int | None = None, **_: Any) -> None:
        self.max_workers = max_workers

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        f: Future[T] = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except Exception as e:
            f.set_exception(e)
        return f

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any]) -> Iterator[T]:
        return map(fn, *iterables)


#: The shardsink modules naming ThreadPoolExecutor, found when ``sys.modules`` had this many entries
#: (looked for again only once more modules are imported: a schedule imports none after the first).
_pool_users: tuple[int, list[ModuleType]] = (-1, [])


def _inline_pools() -> list[tuple[Any, str, Any]]:
    """Every ThreadPoolExecutor the library can reach (``concurrent.futures``' own, for imports made
    inside functions, and every module global of shardsink naming it) made an InlinePool."""
    global _pool_users
    undo: list[tuple[Any, str, Any]] = [(concurrent.futures, "ThreadPoolExecutor", _POOL)]
    concurrent.futures.ThreadPoolExecutor = InlinePool  # type: ignore[misc, assignment]
    if _pool_users[0] != len(sys.modules):
        _pool_users = (len(sys.modules), [mod for name, mod in list(sys.modules.items()) if name.startswith("shardsink")
                                          and mod is not None and getattr(mod, "ThreadPoolExecutor", None) is _POOL])
    for mod in _pool_users[1]:
        if getattr(mod, "ThreadPoolExecutor", None) is _POOL:
            undo.append((mod, "ThreadPoolExecutor", _POOL))
            setattr(mod, "ThreadPoolExecutor", InlinePool)  # noqa: B010
    return undo


def per_process(actor: Any) -> None:
    """Swap in ``actor``'s process memory (None: the world's own, outside every actor)."""
    memory = actor.process if actor is not None else {}
    keeper_mod._views = memory.setdefault("iceberg-views", OrderedDict())


def sim_sleep(world: World) -> Callable[[float], None]:
    """A retry policy's sleep that waits in simulated time."""
    return world.clock.advance


def open_sim_blob(world: World, u: ShardUrl) -> RetryingBlob:
    """The store :func:`shardsink.storage.url.open_blob` returns for a served bucket."""
    return RetryingBlob(MemBlob(world, u.bucket, u.path), policy=_storage_policy(world))


#: The storage policy of the world served last (a policy is immutable: one per world will do).
_POLICY: list[tuple[World, RetryPolicy]] = []


def _storage_policy(world: World) -> RetryPolicy:
    """:data:`STORAGE` sleeping in ``world``'s simulated time (made once per world)."""
    if not _POLICY or _POLICY[0][0] is not world:
        _POLICY[:] = [(world, STORAGE.with_sleep(sim_sleep(world)))]
    return _POLICY[0][1]


@contextmanager
def injected(world: World, seed: int, buckets: Iterable[str]) -> Iterator[None]:
    """Serve ``buckets`` from ``world`` and inject its clock and ``seed`` (see the module docstring)."""
    ids = random.Random(seed ^ 0x5EED)
    saved_random = random.getstate()
    saved = (uuid.uuid4, pa.cpu_count(), keeper_mod._views)
    pools: list[tuple[Any, str, Any]] = []
    log = logging.getLogger("shardsink")
    level = log.level
    names = list(buckets)
    thresholds = gc.get_threshold()
    try:
        gc.set_threshold(*GC_THRESHOLDS)
        uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
        random.seed(seed)
        pools = _inline_pools()
        per_process(None)
        pa.set_cpu_count(1)
        log.setLevel(logging.ERROR)
        for b in names:
            serve(b, lambda u: open_sim_blob(world, u))
        with WALL.using(world.clock.time), UPKEEP.using(mode="inline"):
            yield
    finally:
        for b in names:
            serve(b, None)
        uuid.uuid4 = saved[0]
        for mod, attr, value in pools:
            setattr(mod, attr, value)
        pa.set_cpu_count(saved[1])
        keeper_mod._views = saved[2]
        random.setstate(saved_random)
        log.setLevel(level)
        gc.set_threshold(*thresholds)
