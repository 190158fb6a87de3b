"""The root objects the landing-zone source keeps in each data shard it feeds, registered with
core's layout (:mod:`shardsink.core.keys`):

* ``landing/index.json``: the landed-file index (:mod:`shardsink.sources.landing_index`), a
  cache GC keeps (losing it costs one re-scan of the landing zone, never wrong data);
* ``landing/plans/<desc_id>.json``: the file plan a mint made for one description, read by
  its write jobs, and ``landing/plans/<desc_id>.schemas.json``: the schemas of the files that
  mint listed, read by its ``add_columns`` check (:mod:`shardsink.sources.landing_schemas`);
  caches (a missing one makes the reader list the zone itself), so GC deletes them after its
  grace period.

Importing this module registers them; GC and verify import it so they know these objects.
"""

from __future__ import annotations

from shardsink.core.keys import register_root

INDEX_KEY = "landing/index.json"
PLANS_PREFIX = "landing/plans/"

register_root(INDEX_KEY, owner="landing")
register_root(PLANS_PREFIX, owner="landing", prefix=True, expiry="after_grace")
