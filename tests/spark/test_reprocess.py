"""Re-processing's driver-side read of earlier corrections (the Spark job itself runs in
tests/sinks and the topology tests)."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pytest
from support.evolved_shard import evolved_shard

from shardsink.errors import CorruptionError
from shardsink.spark.reprocess import _read_prior


def test_prior_corrections_written_under_older_schema_ids_read_as_the_jobs_schema(tmp_path: object) -> None:
    """Issue 19: parts of schema ids 0 and 2 read by field id as the current schema (renamed
    old → new, widened n, the new x as nulls: the old x is another field)."""
    s = evolved_shard(f"file://{tmp_path}/s")
    batches = s.batches()
    prior = [*batches[0].parts, *batches[2].parts]
    t = _read_prior(s, prior, s.schema)
    assert t.schema.names == [*s.schema.names, "_time", "_diff"] and t.schema.field("n").type == pa.int64()
    got = sorted((r["k"], r["n"], r["new"], r["x"], r["_time"], r["_diff"]) for r in t.to_pylist())
    assert got == [("a", 1, "o1", None, 1, 1), ("a", 1, "o1", None, 1, 1), ("a", 1, "o1", None, 25, -1),
                   ("b", 2, "o2", None, 3, 1), ("c", 3, None, None, 5, 1), ("e", 5, "n5", None, 22, 1)]
    gone = msgspec.structs.replace(prior[0], key="parts/gone/x.parquet")
    with pytest.raises(CorruptionError, match="left the state while being read"):
        _read_prior(s, [gone], s.schema)
