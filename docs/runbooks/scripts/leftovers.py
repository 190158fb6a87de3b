"""What writers staged that no version of a shard references, by description: age, size, fate.

    py - SHARD [DESC_ID | DAG RUN_ID] < docs/runbooks/scripts/leftovers.py

With a description id, or a DAG id and run id (every description of that run: their ids
start with the DAG id and the run id's slug), it keeps those and lists each of their
objects. Fates (shardsink.maintenance.leftovers):

  still_possible  not committed, and the shard's upper has not passed its lower: its writer
                  may be running or its append be retried. Never delete it.
  cannot_commit   the upper passed its lower: `shardsink gc --desc` deletes all of it.
  committed       committed; these objects are not in its batch: `gc --desc` deletes them.
  unknown         its evidence is older than the retained history (exit 5 in `gc --desc`).
  compaction      a compaction's output, decided by `shardsink compact`'s sweep.
  undecided       nothing tells its lower yet (a young Spark _temporary/ file, say).

Ages are seconds since the object was written (the store's clock).
"""

import sys

from shardsink.core.shard import Shard
from shardsink.maintenance.leftovers import leftovers
from shardsink.sinks.description import make_desc_id, run_of

if len(sys.argv) not in (2, 3, 4):
    sys.exit(__doc__)
shard = Shard.open(sys.argv[1])
found = leftovers(shard)
if len(sys.argv) == 3:
    found = [x for x in found if x.desc_id == sys.argv[2]]
elif len(sys.argv) == 4:
    dag, run = sys.argv[2], run_of(make_desc_id(sys.argv[2], sys.argv[3], 0), sys.argv[2])
    found = [x for x in found if run_of(x.desc_id, dag) == run]
print(f"{len(found)} descriptions with unreferenced staged objects in {shard.url}")
for x in found:
    print(f"{x.desc_id}  {x.fate}  lower {x.lower}  {x.parts} parts ({x.part_bytes} bytes), {x.manifests} manifests, "
          f"{x.youngest_s:.0f}..{x.oldest_s:.0f} s old: {x.note}")
    if len(sys.argv) > 2:
        for o in x.objects:
            spark = "  (Spark _temporary)" if o.temporary else ""
            print(f"    {o.key}  {o.kind}  {o.bytes} bytes  {o.age_s:.0f} s old{spark}")
