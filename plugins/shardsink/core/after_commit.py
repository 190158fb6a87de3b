"""After-commit hooks: what a capability above core keeps derived from each committed version.

A capability that keeps a *derived* view of a shard (the Iceberg view, :mod:`shardsink.iceberg`)
is turned on by a shard option (:meth:`shardsink.core.state.Header.option`) and registers a hook
for it at import (:func:`register_after_commit`). ``Machine.commit`` calls :func:`notify` right
after every version it committed, in the committing process, whoever committed (an append,
compaction, a since advance, the CLI): the hooks of the options the new version has set, or that
its commit changed, run with a :class:`Committed` (the version and the shard's registered root
objects on the committing store).

Derived, never in the way: a hook's error is logged and swallowed (the commit has happened and
is reported as such); a hook is never consulted for correctness, and what it leaves behind is
caught up by its capability's own repair (for the Iceberg view, ``shardsink iceberg sync``).
A hook may hand its work to a worker of its own rather than do it in the committing call (the
Iceberg view's upkeep does, by default); such a capability registers a *drain*
(:func:`register_drain`), and whoever ends a unit of work that committed (an Airflow task before it
reports success, the CLI before it exits) calls :func:`drain` to wait until that work is done,
without knowing the capabilities.
An option whose capability is not imported yet is looked up once as the module
``shardsink.<option>`` (a capability is named by its option), so a process that commits need
not import every capability to keep their views current.

Contract: this module imports nothing above core.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from shardsink.core.commits import OptionCommit
from shardsink.core.roots import RootObjects
from shardsink.core.state import Version
from shardsink.storage.base import Blob

log = logging.getLogger("shardsink.core")


@dataclass(frozen=True)
class Committed:
    """A version just committed at shard ``url``; ``roots``: the shard's registered root objects
    on the committing store (the hook's only way to write)."""

    url: str
    version: Version
    roots: RootObjects


Hook = Callable[[Committed], None]
_lock = threading.Lock()
_hooks: dict[str, Hook] = {}
_looked_up: set[str] = set()
_F = TypeVar("_F", bound=Callable[..., Any])


def _register(table: dict[str, _F], option: str, fn: _F, what: str) -> None:
    """One function of kind ``what`` per option; registering the same one again is a no-op."""
    with _lock:
        got = table.setdefault(option, fn)
    if got is not fn:
        raise ValueError(f"{what} is already registered for option {option!r}")


def _registered(table: dict[str, _F], head: Version) -> Iterator[tuple[str, _F]]:
    """``(option, its function in table)`` for each option of ``head`` that has one (importing
    the option's capability first, which registers its functions)."""
    for name, _ in head.header.options:
        _hook_for(name)
        with _lock:
            fn = table.get(name)
        if fn is not None:
            yield name, fn


def register_after_commit(option: str, hook: Hook) -> None:
    """Run ``hook`` after every commit of a shard whose option ``option`` is set (or was just
    changed). One hook per option; registering the same one again is a no-op."""
    _register(_hooks, option, hook, "an after-commit hook")


def _hook_for(option: str) -> Hook | None:
    with _lock:
        if option in _hooks or option in _looked_up:
            return _hooks.get(option)
        _looked_up.add(option)
    name = f"shardsink.{option}"
    try:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    except ImportError as e:  # the capability's extra is not installed: its view stays behind
        log.warning("shard option %r is set but %s cannot be imported (%s); its view is not kept", option, name, e)
    with _lock:
        return _hooks.get(option)


#: What a capability's view still references of the shard's parts (GC keeps them): ``(url,
#: the shard's head version, its root objects)`` → part keys.
Holder = Callable[[str, Version, RootObjects], frozenset[str]]
_holders: dict[str, Holder] = {}


def register_part_holder(option: str, holder: Holder) -> None:
    """Declare that the view of option ``option`` references parts: GC asks ``holder`` (through
    :func:`held_parts`) and keeps every part it names, whatever the retained state versions say."""
    _register(_holders, option, holder, "a part holder")


def held_parts(url: str, head: Version, roots: RootObjects) -> frozenset[str]:
    """The parts the views of ``head``'s options reference (GC keeps them). Raises what a holder
    raises, and LookupError for an option whose capability cannot be imported: GC must then keep
    every part (it cannot know what the view references)."""
    out: set[str] = set()
    for name, _ in head.header.options:
        _hook_for(name)  # imports the capability, which registers its holder
        with _lock:
            holder = _holders.get(name)
        if holder is None and _hooks.get(name) is not None:
            continue  # a capability that keeps a view referencing no parts
        if holder is None:
            raise LookupError(f"shard option {name!r} is set but no capability shardsink.{name} is importable: "
                              "what its view references is unknown")
        out |= holder(url, head, roots)
    return frozenset(out)


#: A capability's own garbage for GC: ``(url, head, root objects, cutoff epoch s)`` → root-object keys
#: its view no longer needs, none modified after ``cutoff`` (GC deletes them after its grace period).
Collector = Callable[[str, Version, RootObjects, float], list[str]]
_collectors: dict[str, Collector] = {}


def register_view_collector(option: str, collector: Collector) -> None:
    """Declare what GC may delete of the view of option ``option`` (:func:`view_garbage`)."""
    _register(_collectors, option, collector, "a view collector")


def view_garbage(url: str, head: Version, roots: RootObjects, cutoff: float) -> list[str]:
    """The root objects the views of ``head``'s options no longer need, older than ``cutoff``."""
    return [key for _, collector in _registered(_collectors, head) for key in collector(url, head, roots, cutoff)]


#: A capability's check of its view for ``verify``: ``(url, head, root objects)`` → ``(object, problem)`` pairs.
Checker = Callable[[str, Version, RootObjects], list[tuple[str, str]]]
_checkers: dict[str, Checker] = {}


def register_view_check(option: str, checker: Checker) -> None:
    """Declare how ``verify`` checks the view of option ``option`` (:func:`check_views`)."""
    _register(_checkers, option, checker, "a view check")


def check_views(url: str, head: Version, roots: RootObjects) -> list[tuple[str, str]]:
    """The problems the views of ``head``'s options have (``(object, what is wrong)``); a view whose
    check fails is one problem naming the failure."""
    out: list[tuple[str, str]] = []
    for name, checker in _registered(_checkers, head):
        try:
            out += checker(url, head, roots)
        except Exception as e:  # the check itself failed: report it, do not guess
            out.append((f"{url} ({name} view)", f"cannot be checked: {type(e).__name__}: {e}"))
    return out


#: How long a unit of work that committed (an Airflow shard task, a CLI command) waits for the
#: after-commit work it queued (seconds) before it reports; past it the views catch up at the
#: next commit or sync.
DRAIN_TIMEOUT = 300.0
#: Waits until a capability's queued after-commit work is done (at most ``timeout`` seconds, None:
#: no limit); False when it timed out. Never raises.
Drain = Callable[[float | None], bool]
_drains: dict[str, Drain] = {}


def register_drain(option: str, fn: Drain) -> None:
    """Declare that the hook of option ``option`` may leave work queued after the committing call
    returns, and how to wait for it (:func:`drain`)."""
    _register(_drains, option, fn, "a drain")


def drain(timeout: float | None = None) -> bool:
    """Wait until the after-commit work queued in this process is done, for every capability
    imported here (one not imported has queued nothing); each waits at most ``timeout`` seconds.
    False when one timed out (its view stays behind until the next commit or sync). Never raises."""
    with _lock:
        fns = list(_drains.items())
    done = True
    for name, fn in fns:
        try:
            done = fn(timeout) and done
        except Exception as e:  # derived, never in the way
            log.warning("draining the after-commit work of option %r failed (%s: %s)", name, type(e).__name__, e)
            done = False
    return done


def notify(url: str, blob: Blob, version: Version) -> None:
    """Run the hooks of ``version``'s options (and of an option its commit changed); never raises."""
    names = [n for n, _ in version.header.options]
    if isinstance(version.commit, OptionCommit) and version.commit.name not in names:
        names.append(version.commit.name)
    for name in names:
        try:
            hook = _hook_for(name)
            if hook is not None:
                hook(Committed(url, version, RootObjects(url, blob=blob)))
        except Exception as e:  # derived, never in the way: the commit stands
            log.warning("%s: after-commit hook of option %r failed at seqno %d (%s: %s); "
                        "its view is behind until the next commit or sync", url, name, version.seqno,
                        type(e).__name__, e)
