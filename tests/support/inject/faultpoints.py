"""Test-only fault injection through :mod:`shardsink.hooks` (the library's no-op hook registry).

A fault spec (JSON-able) names faults and when they apply::

    {"write_kill": {"slot": 1, "once": "/tmp/x/killed"},        # SIGKILL a write job after staging
     "append_ack_lost": {"once": "/tmp/x/lost"},                 # commit, then raise UnknownOutcomeError
     "append_wait": {"attempt": 1, "until": "/tmp/x/go"},        # hold an append before its commit
     "copy_staged": {"to": "/tmp/x/staged"}}                     # copy the manifests an append is about to commit

Keys other than ``once``/``until``/``timeout`` must equal the hook's context values
(``slot``, ``attempt``). ``once`` is a marker path: the fault fires only if the marker
does not exist yet and creates it atomically, so an Airflow retry of the task runs clean.

:func:`install` registers the faults in this process. For subprocesses (``airflow dags
test``, the tasks it runs, spark-submit and its Python driver) :func:`fault_env` gives
the environment that makes ``sitecustomize.py`` (beside this file) install them at
interpreter start. The library never looks at that variable.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV = "SHARDSINK_TEST_FAULTS"
HERE = str(Path(__file__).resolve().parent)
_CONTROL = ("once", "until", "timeout")


def _applies(cfg: Mapping[str, Any], ctx: Mapping[str, Any]) -> bool:
    return all(ctx.get(k) == v for k, v in cfg.items() if k not in _CONTROL and k in ctx)


def _claim(marker: str | None) -> bool:
    if marker is None:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def install(spec: Mapping[str, Mapping[str, Any]]) -> Callable[[], None]:
    """Register the faults of ``spec`` in this process; returns a function removing them."""
    from shardsink import hooks

    removers: list[Callable[[], None]] = []
    if (kill := spec.get("write_kill")) is not None:
        def write_kill(**ctx: Any) -> None:
            if _applies(kill, ctx) and _claim(kill.get("once")):
                print(f"SHARDSINK_FAULT write_kill: killing slot {ctx['slot']} after staging {ctx['parts']} parts",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        removers.append(hooks.register("write.staged", write_kill))
    if (wait := spec.get("append_wait")) is not None:
        def append_wait(**ctx: Any) -> None:
            if not _applies(wait, ctx):
                return
            deadline = time.monotonic() + float(wait.get("timeout", 300))
            while not os.path.exists(wait["until"]) and time.monotonic() < deadline:
                time.sleep(0.2)  # a file handshake across Airflow's processes (no pipe to them): polled, bounded

        removers.append(hooks.register("append.before_commit", append_wait))
    if (lost := spec.get("append_ack_lost")) is not None:
        def append_ack_lost(**ctx: Any) -> None:
            from shardsink.errors import UnknownOutcomeError

            if _applies(lost, ctx) and _claim(lost.get("once")):
                raise UnknownOutcomeError(f"injected fault: the acknowledgement of {ctx['desc_id']} was lost")

        removers.append(hooks.register("append.committed", append_ack_lost))

    if (copy := spec.get("copy_staged")) is not None:
        def copy_staged(**ctx: Any) -> None:
            from shardsink.storage.url import open_blob

            blob = open_blob(ctx["shard_url"])  # in the task's store access (credentials of its connection)
            target = Path(copy["to"]) / ctx["desc_id"]
            target.mkdir(parents=True, exist_ok=True)
            for o in blob.list(f"staging/{ctx['desc_id']}/"):
                got = blob.get(o.key)
                if got is not None:
                    (target / o.key.rsplit("/", 1)[-1]).write_bytes(got.data)

        removers.append(hooks.register("append.before_commit", copy_staged))

    def remove() -> None:
        for r in removers:
            r()

    return remove


def fault_env(spec: Mapping[str, Mapping[str, Any]], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment additions that install ``spec`` in every Python subprocess started with them."""
    base = (env if env is not None else os.environ).get("PYTHONPATH", "")
    return {ENV: json.dumps(spec), "PYTHONPATH": os.pathsep.join(p for p in (HERE, base) if p)}
