"""read/plan.py's per-part projection (issue 19 §1): on an evolved shard every engine reads each
part through its own schema id onto the current schema, equal to the core's snapshot and changes."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
from read_helpers import evolved

import shardsink.read
from shardsink.read.plan import open_plan
from shardsink.read.tables import engine_table


def _key(row: dict[str, Any]) -> str:
    return repr(sorted((k, "NaN" if isinstance(v, float) and v != v else v) for k, v in row.items()))


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.names == b.schema.names
    assert sorted(map(_key, a.to_pylist())) == sorted(map(_key, b.to_pylist()))


def test_the_plan_projects_each_part_by_field_id_onto_the_current_schema(tmp_path: Any) -> None:
    s = evolved(f"file://{tmp_path}/s")
    plan, lease = open_plan(s.url)
    try:
        assert plan.schema.names == ["k", "w", "y", "note"] and plan.schema.field("k").type == pa.int64()
        first = next(r for r in plan.parts if r.schema_id == 0)
        assert [(c.name, c.source, c.type) for c in first.projection] == [
            ("k", "k", pa.int64()), ("w", "v", pa.string()), ("y", "y", pa.float64()), ("note", None, pa.string())]
        assert [g.schema_id for g, _ in plan.groups()] == [0, 1, 2, 4]
    finally:
        lease.close()


@pytest.mark.parametrize("engine", ["duckdb", "polars"])
def test_an_evolved_shard_reads_through_each_engine_as_the_core_snapshot(shard_url: str, engine: str) -> None:
    s = evolved(shard_url)
    for as_of in (5, 15, 25, 39):
        _same(engine_table(engine, s.url, as_of=as_of), s.snapshot(as_of))
    for lo, hi in ((0, 40), (10, 31)):
        _same(engine_table(engine, s.url, changes=(lo, hi)), s.changes(lo, hi))


def test_the_duckdb_relation_has_the_current_columns_and_types(tmp_path: Any) -> None:
    s = evolved(f"file://{tmp_path}/s")
    with shardsink.read.duckdb(duckdb.connect(), s.url) as rel:
        assert rel.columns == ["k", "w", "y", "note", "_count"]
        assert [str(t) for t in rel.types][:1] == ["BIGINT"]
        assert (2**40, "f", 3.0, "n6", 2) in rel.fetchall()
