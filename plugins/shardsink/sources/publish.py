"""After a data commit: let the shard's source publish its progress upstream.

Contract: :func:`after_commit` is called by the append step right after a data commit,
with the source's spec. For a reclocked source (a spec with a ``remap`` shard, see
:mod:`shardsink.reclock.source`) it rebuilds the source and calls its
``after_commit(shard_url)`` hook (a Kafka source commits its consumer-group offsets); for
other specs (landing sources, views) it does nothing. It never fails the commit it
follows: an error is logged and recorded as the source's health (the next commit retries).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shardsink.reclock import health
from shardsink.reclock.source import ReclockedBase
from shardsink.sources.base import source_from_spec
from shardsink.specs import RoutedSpec, SourceSpec, spec_to_builtins

log = logging.getLogger("shardsink.reclock")


def after_commit(spec: Mapping[str, Any] | SourceSpec, shard_url: str) -> None:
    """After a data commit: let a reclocked source publish its resumption frontier.

    A no-op for other specs (landing sources, views). Never fails the commit it follows:
    an error is logged and recorded as the source's health (the next commit retries).
    """
    if isinstance(spec, Mapping):
        if "remap" not in spec:
            return
    elif not isinstance(spec, RoutedSpec) and "remap" not in spec_to_builtins(spec):
        return
    src = source_from_spec(spec)
    if not isinstance(src, ReclockedBase):
        return
    try:
        src.after_commit(shard_url)
    except Exception as e:  # the data commit stands; publishing progress upstream is best effort
        log.warning("could not publish the resumption frontier of %s: %s", src.remap_url, e)
        health.record_failure(src.remap_url, f"publishing the resumption frontier: {type(e).__name__}: {e}")
