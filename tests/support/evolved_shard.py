"""A shard whose schema evolved between appends (issue 19): one batch per schema id, covering
add, rename, drop, widen and a dropped name added again with a new field id.

=========  =======================================================  ========  ======
schema id  user columns after the change                            change    batch
=========  =======================================================  ========  ======
0          k string, n int32, f float32, old string                 (create)  [0, 10)
1          + x int64                                                add       [10, 20)
2          old → new                                                rename    [20, 30)
3          − f                                                      drop      [30, 40)
4          n int32 → int64                                          widen     [40, 50)
5, 6       − x, then + x string (a new field id: old x stays hidden)  drop/add  [50, 60)
=========  =======================================================  ========  ======

Batch 0 holds two rows that differ only in ``f``: once ``f`` is dropped they are the same
row (count 2), retracted one at a time later, so a reader that skips consolidating a
projected part gets it wrong.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int32()), ("f", pa.float32()), ("old", pa.string())])
UPPER = 60


def _append(s: Shard, rows: list[tuple[Any, ...]], lower: int) -> None:
    """``rows`` (user columns of the current schema, then _time, _diff) as batch ``[lower, lower + 10)``."""
    user = s.schema
    fields = [*user, pa.field("_time", pa.int64()), pa.field("_diff", pa.int64())]
    cols = list(zip(*rows, strict=True))
    t = pa.table([pa.array(c, f.type) for c, f in zip(cols, fields, strict=True)], schema=pa.schema(fields))
    s.append(t, lower=lower, upper=lower + 10, desc_id=f"b{lower}")


def evolved_shard(url: str) -> Shard:
    """Create the shard of the module docstring at ``url`` (upper :data:`UPPER`)."""
    s = Shard.create(url, SCHEMA)
    _append(s, [("a", 1, 0.5, "o1", 1, 1), ("a", 1, 1.5, "o1", 1, 1), ("b", 2, 2.5, "o2", 3, 1),
                ("c", 3, None, None, 5, 1)], 0)
    s.evolve(SchemaChange(kind="add", name="x", type="int64"))
    _append(s, [("b", 2, 2.5, "o2", None, 12, -1), ("d", 4, 4.5, "o4", 40, 15, 1)], 10)
    s.evolve(SchemaChange(kind="rename", name="old", new_name="new"))
    _append(s, [("e", 5, 5.5, "n5", 50, 22, 1), ("a", 1, 0.5, "o1", None, 25, -1)], 20)
    s.evolve(SchemaChange(kind="drop", name="f"))
    _append(s, [("f", 6, "n6", 60, 33, 1), ("a", 1, "o1", None, 35, -1)], 30)
    s.evolve(SchemaChange(kind="widen", name="n", type="int64"))
    _append(s, [("g", 2**40, "n7", 70, 44, 1)], 40)
    s.evolve(SchemaChange(kind="drop", name="x"))
    s.evolve(SchemaChange(kind="add", name="x", type="string"))
    _append(s, [("h", 8, "n8", "x8", 55, 1)], 50)
    return s


#: (as_of, schema choice) snapshots and ((lower, upper), schema choice) change feeds that
#: together read every schema id's parts, projected onto several reader schemas.
SNAPSHOTS: list[tuple[int, str]] = [(59, "current"), (25, "as_of")]
CHANGES: list[tuple[tuple[int, int], str]] = [((0, 60), "current"), ((20, 45), "as_of")]


def rows(t: pa.Table) -> list[tuple[Any, ...]]:
    """``t``'s rows as sorted tuples (for comparing results of different engines)."""
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)
