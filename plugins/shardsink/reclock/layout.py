"""The root objects reclocking keeps in shards, registered with core (:mod:`shardsink.core.roots`).

* in a remap shard: ``plans/<lower>-<upper>.json`` bound inputs (caches: a missing one is
  rebuilt from the remap shard, so GC deletes them after its grace period) and
  ``health.json`` (the last failure);
* in every data shard a reclocked source writes: ``reclock.json``, its remap shard and source spec.

Importing this module registers them; GC and verify import it so they know these objects.
"""

from __future__ import annotations

from shardsink.core.roots import register_root

PLANS_PREFIX = "plans/"
HEALTH_KEY = "health.json"
SIDECAR_KEY = "reclock.json"

register_root(PLANS_PREFIX, owner="reclock", prefix=True, expiry="after_grace")
register_root(HEALTH_KEY, owner="reclock")
register_root(SIDECAR_KEY, owner="reclock")
