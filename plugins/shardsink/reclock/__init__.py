"""Reclocking (seed 000): bind a source's own progress (offsets) to shard times.

* :mod:`~shardsink.reclock.bindings`: what a binding is, stamping and resumption (pure);
* :mod:`~shardsink.reclock.remap`: the remap shard and minting by compare-and-append;
* :mod:`~shardsink.reclock.source`: what reclocked sources share (hooks, routing, health);
* :mod:`~shardsink.reclock.health`: source health and the data shard's pointer to its remap shard.

The sources live in :mod:`shardsink.sources.files` and :mod:`shardsink.sources.kafka`.
"""

from shardsink.reclock.bindings import Binding, Bindings, BoundFile, Span
from shardsink.reclock.remap import RemapShard
from shardsink.reclock.source import Reclocked, Routing

__all__ = ["Binding", "Bindings", "BoundFile", "Reclocked", "RemapShard", "Routing", "Span"]
