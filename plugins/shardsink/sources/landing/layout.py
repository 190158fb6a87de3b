"""The root objects the landing-zone source keeps in each data shard it feeds, registered with
core (:mod:`shardsink.core.roots`):

* ``landing/index.json``: the landed-file index (:mod:`shardsink.sources.landing.index`), a
  cache GC keeps (losing it costs one re-scan of the landing zone, never wrong data), and
  ``landing/index-delta/<n>.json``: its ring of delta segments, a fixed number of slots
  reused in turn (:mod:`shardsink.sources.landing.index_store`), kept by GC too;
* ``landing/plans/<desc_id>.json``: the file plan a mint made for one description, read by
  its write jobs, and ``landing/plans/<desc_id>.schemas.json``: the schemas of the files that
  mint listed, read by its ``add_columns`` check (:mod:`shardsink.sources.landing.schemas`).
  A plan is what its description's input IS (the description seals its times as of the mint's
  listing), so GC keeps both as long as the description may commit, like its staged parts, and
  deletes them once its fate is final and they are older than its grace period.

Importing this module registers them; GC and verify import it so they know these objects.
"""

from __future__ import annotations

from shardsink.core.roots import register_root

INDEX_KEY = "landing/index.json"
DELTAS_PREFIX = "landing/index-delta/"
PLANS_PREFIX = "landing/plans/"

register_root(INDEX_KEY, owner="landing")
register_root(DELTAS_PREFIX, owner="landing", prefix=True)
register_root(PLANS_PREFIX, owner="landing", prefix=True, expiry="when_final")


def delta_key(slot: int) -> str:
    """The index's delta ring slot ``slot``."""
    return f"{DELTAS_PREFIX}{slot}.json"
