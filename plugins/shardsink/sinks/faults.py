"""Fault points for tests and drills: crash or stall a step at a chosen moment.

Off unless ``SHARDSINK_FAULTS`` names a JSON object, e.g.::

    SHARDSINK_FAULTS='{"write_kill": {"slot": 1, "once": "/tmp/x/killed"},
                       "append_ack_lost": {"once": "/tmp/x/lost"},
                       "append_wait": {"attempt": 1, "until": "/tmp/x/go"}}'

``once`` is a marker path: the fault fires only if the marker does not exist yet and
creates it (atomically), so an Airflow retry of the same task runs clean. The variable
is read from the environment of the process, which Airflow tasks and spark-submit
inherit; nothing else in shardsink looks at it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def _faults() -> dict[str, Any]:
    raw = os.environ.get("SHARDSINK_FAULTS")
    return json.loads(raw) if raw else {}


def _claim(marker: str | None) -> bool:
    if marker is None:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def fire(point: str, **ctx: Any) -> dict[str, Any] | None:
    """The fault config for ``point`` if it applies to ``ctx`` (and its marker was free)."""
    cfg = _faults().get(point)
    if not cfg:
        return None
    for k, v in cfg.items():
        if k in ctx and ctx[k] != v:
            return None
    return cfg if _claim(cfg.get("once")) else None


def wait_until(point: str, **ctx: Any) -> None:
    """Block while the ``until`` marker of ``point`` is absent (bounded by ``timeout``)."""
    cfg = _faults().get(point)
    if not cfg or any(k in ctx and ctx[k] != v for k, v in cfg.items()):
        return
    deadline = time.monotonic() + float(cfg.get("timeout", 300))
    while not os.path.exists(cfg["until"]) and time.monotonic() < deadline:
        time.sleep(0.2)
