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


#: Ten schema ids (:func:`ten_versions`): each change, the schema id it makes, and the
#: native scans (:func:`shardsink.spark.native_read.scan_groups`) the current schema needs.
TEN_CHANGES = [SchemaChange(kind="widen", name="n", type="int16"),          # 1
               SchemaChange(kind="add", name="x", type="int64"),            # 2
               SchemaChange(kind="rename", name="v", new_name="V"),         # 3: a name differing in case only
               SchemaChange(kind="drop", name="f"),                         # 4
               SchemaChange(kind="widen", name="d", type="decimal128(12,2)"),  # 5
               SchemaChange(kind="rename", name="s", new_name="t"),         # 6
               SchemaChange(kind="add", name="s", type="int32"),            # 7: an old name, a new field id
               SchemaChange(kind="widen", name="n", type="int64"),          # 8
               SchemaChange(kind="widen", name="t", type="large_string")]   # 9
TEN_SCAN_GROUPS = [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9]]


def ten_versions(url: str) -> Shard:
    """A shard under ten schema ids, one batch ``[10 i, 10 i + 10)`` each (schema id ``i``):
    :data:`TEN_CHANGES` from ``k string, n int8, f float32, d decimal128(10,2), s string,
    v string``. Values sit at the old types' limits (int8 -128/127, float32 0.1, decimal
    99999999.99); batch 0 holds two rows differing only in ``f`` (one row once ``f`` is
    dropped); later batches retract rows of earlier schema ids."""
    from decimal import Decimal

    s = Shard.create(url, pa.schema([("k", pa.string()), ("n", pa.int8()), ("f", pa.float32()),
                                     ("d", pa.decimal128(10, 2)), ("s", pa.string()), ("v", pa.string())]))
    big = Decimal("99999999.99")
    _append(s, [("a", -128, 0.1, big, "s0", "v0", 1, 1), ("a", -128, 0.2, big, "s0", "v0", 1, 1),
                ("b", 127, None, Decimal("-1.50"), None, "v1", 3, 1), ("c", 0, 1.5, None, "s2", None, 5, 1)], 0)
    batches: list[list[tuple[Any, ...]]] = [
        [("b", 127, None, Decimal("-1.50"), None, "v1", 12, -1), ("d", 300, 2.5, big, "s3", "v3", 15, 1)],
        [("e", -300, 3.5, Decimal("0.01"), "s4", "v4", 40, 21, 1), ("a", -128, 0.1, big, "s0", "v0", None, 25, -1)],
        [("f", 1, 4.5, big, "s5", "V5", None, 33, 1), ("c", 0, 1.5, None, "s2", None, None, 35, -1)],
        [("g", 2**14, Decimal("1.00"), "s6", "V6", 7, 44, 1), ("a", -128, big, "s0", "v0", None, 45, -1)],
        [("h", -2**15, Decimal("9999999999.99"), "s7", "V7", 8, 55, 1)],
        [("i", 9, big, "t8", "V8", 9, 61, 1), ("h", -2**15, Decimal("9999999999.99"), "s7", "V7", 8, 66, -1)],
        [("j", 10, Decimal("-0.01"), "t9", "V9", None, -2**31, 75, 1), ("i", 9, big, "t8", "V8", 9, None, 77, -1)],
        [("k", 2**40, Decimal("2.00"), "t10", "V10", 11, 2**31 - 1, 81, 1)],
        [("l", -2**40, Decimal("3.00"), "t11", "V11", 12, 0, 95, 1), ("j", 10, Decimal("-0.01"), "t9", "V9", None,
                                                                       -2**31, 99, -1)]]
    for i, (change, batch) in enumerate(zip(TEN_CHANGES, batches, strict=True), start=1):
        s.evolve(change)
        _append(s, batch, 10 * i)
    return s


#: Reads of :func:`ten_versions` covering every schema id's parts under several reader schemas.
TEN_SNAPSHOTS: list[tuple[int, str]] = [(99, "current"), (99, "as_of"), (9, "current"), (9, "as_of"),
                                        (47, "as_of"), (72, "as_of"), (35, "current")]
TEN_CHANGES_READS: list[tuple[tuple[int, int], str]] = [((0, 100), "current"), ((0, 100), "as_of"),
                                                        ((0, 30), "as_of"), ((20, 70), "as_of"),
                                                        ((45, 90), "current"), ((12, 13), "current")]


def rows(t: pa.Table) -> list[tuple[Any, ...]]:
    """``t``'s rows as sorted tuples (for comparing results of different engines)."""
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)
