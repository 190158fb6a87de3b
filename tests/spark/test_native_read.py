"""Native planning under schema evolution (issue 19): each schema id's parts read with their
own schema and projected by field id, equal to :meth:`Shard.snapshot` / :meth:`Shard.changes`
and to the Python data source."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from support.evolved_shard import CHANGES, SNAPSHOTS, evolved_shard, rows

from shardsink.core.schema import SchemaChange
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.spark import native_read as nr
from shardsink.spark.read import ShardReads


def _spark_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_reads_of_an_evolved_shard_equal_the_shard_on_both_paths(spark: Any, shard_url: str, backend: str) -> None:
    """Add, rename, drop, widen and a dropped name added again, read with the current and the
    as-of schema: natively on the local store, through the data source on S3 (the test
    session has no s3a; tests/spark/test_datasource.py checks the source's own projection)."""
    s = evolved_shard(shard_url)
    with ShardReads(spark, native="always" if backend == "local" else "never") as reads:
        for as_of, choice in SNAPSHOTS:
            want = s.snapshot(as_of, schema=choice)  # type: ignore[arg-type]
            df = reads.snapshot(s.url, as_of, schema=choice)  # type: ignore[arg-type]
            assert df.columns == want.schema.names, (as_of, choice)
            assert _spark_rows(df) == rows(want), (as_of, choice)
        for (lo, hi), choice in CHANGES:
            want = s.changes(lo, hi, schema=choice)  # type: ignore[arg-type]
            df = reads.changes(s.url, lo, hi, schema=choice)  # type: ignore[arg-type]
            assert df.columns == want.schema.names, (lo, hi, choice)
            assert _spark_rows(df) == rows(want), (lo, hi, choice)
        assert reads.updates(s.url).columns == ["k", "n", "new", "x", "_diff"]


def test_a_part_whose_projection_leaves_out_one_of_its_columns_is_always_consolidated(tmp_path: Any) -> None:
    """Such a projection may make two of its rows equal (a dropped column told them apart);
    adding, renaming and widening cannot, so those parts still skip the consolidation."""
    s = evolved_shard(f"file://{tmp_path}/s")
    h = s.reader().head().header
    batches = s.batches()
    plan = s.reader().plan(changes=(0, 60), schema=h.schemas[-1].id)  # every older schema id holds a column now gone
    alone, shared = nr.consolidation_split(plan)
    assert [r.part.key for r in alone] == [batches[-1].parts[0].key], "only the current schema's isolated part"
    assert {r.part.key for r in shared} == {p.key for b in batches[:-1] for p in b.parts}
    assert all(r.part.is_sorted for r in shared), "the parts themselves are returned unchanged"
    widened = s.reader().plan(changes=(30, 50), schema=h.schemas[4].id)  # ids 3 -> 4 only widen n
    assert [r.part.key for r in widened.parts] == [batches[3].parts[0].key, batches[4].parts[0].key]
    alone, _ = nr.consolidation_split(widened)
    assert [r.part.key for r in alone] == [batches[3].parts[0].key, batches[4].parts[0].key]
    assert widened.parts[0].schema_id != widened.target.id and not widened.parts[0].drops


def test_a_part_whose_own_schema_spark_cannot_read_exactly_is_not_read_natively(tmp_path: Any) -> None:
    s = Shard.create(f"file://{tmp_path}/u", pa.schema([("k", pa.string()), ("u", pa.uint32())]))
    s.append(pa.table({"k": ["a"], "u": pa.array([1], pa.uint32()), "_time": [1], "_diff": [1]}), lower=0, upper=10)
    s.evolve(SchemaChange(kind="drop", name="u"))
    plan = s.reader().plan()
    assert [str(x) for x in plan.schemas()] == ["k: string", "k: string\nu: uint32"]
    with pytest.raises(InvalidUsageError, match="uint32"):
        nr.native_root(None, s.url, plan.schemas(), "always")  # type: ignore[arg-type]
    empty = s.reader().plan(changes=(0, 0)).schemas()
    assert nr.native_root(None, s.url, empty, "always") == f"file://{tmp_path}/u"  # type: ignore[arg-type]
