"""Named hook points where tests and drills inject faults; by default nothing happens (public
name: :mod:`shardsink.hooks`).

Production code calls :func:`fire` at a few chosen moments; with no hook registered
(always, in production) it returns at once. Nothing in the library registers a hook or
reads the environment, a file or a setting to find one: a test registers hooks in the
process under test, directly (:func:`register`) or, for Airflow task and spark-submit
subprocesses, through a ``sitecustomize`` module the test puts on their ``PYTHONPATH``
(tests/support/inject/).

Points and their context (keyword arguments):

* ``write.staged``: a write job staged its parts, before it publishes its manifest
  (``shard_url``, ``slot``, ``attempt``, ``desc_id``, ``parts``).
* ``append.before_commit``: an append verified its manifests, before compare-and-append
  (``shard_url``, ``desc_id``, ``attempt``).
* ``append.committed``: compare-and-append committed, before the staged leftovers are
  cleaned up and the answer returned (``shard_url``, ``desc_id``, ``attempt``, ``seqno``).
* ``landing.index_put``: a mint is about to write the landed-file index
  (:mod:`shardsink.sources.landing.index`) (``shard_url``, ``entries``).
* ``trigger.poked``: a shard-watching trigger read the head, before deciding on it
  (:mod:`shardsink.airflow.triggers`; in the trigger's thread) (``shard_url``, ``upper``).

A hook may block, raise (the step fails as if the error happened there) or end the
process; what it may not do is change data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

HookPoint = Literal["write.staged", "append.before_commit", "append.committed", "landing.index_put",
                    "trigger.poked"]
Hook = Callable[..., None]

_hooks: dict[str, list[Hook]] = {}


def register(point: HookPoint, hook: Hook) -> Callable[[], None]:
    """Call ``hook(**context)`` whenever ``point`` fires; returns a function that removes it."""
    _hooks.setdefault(point, []).append(hook)

    def remove() -> None:
        if hook in _hooks.get(point, []):
            _hooks[point].remove(hook)

    return remove


def fire(point: HookPoint, **context: Any) -> None:
    """Run the hooks of ``point`` in registration order (none registered: a no-op)."""
    for hook in list(_hooks.get(point, ())):
        hook(**context)
