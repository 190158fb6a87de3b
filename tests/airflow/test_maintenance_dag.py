"""The maintenance DAG under real `airflow dags test`: dags/example_maintenance.py over two
shards (one in a local folder, one on S3 over HTTP), one mapped task per shard, with the
OpenLineage file transport and StatsD on a real UDP listener (one run checks all three)."""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa
from af_helpers import Env, UdpListener, lineage_env, lineage_events, ok, read_lineage

from shardsink import Shard
from shardsink.maintenance.verify import verify
from shardsink.provider.lineage import shard_dataset
from shardsink_dev.dagrunner import dags_test
from shardsink_dev.testing import MotoServer

SCHEMA = pa.schema([("k", pa.string())])


def _shard_with_leftovers(url: str) -> tuple[Shard, set[str], int]:
    """4 committed batches and a lost description's leftovers (their keys and part bytes)."""
    shard = Shard.create(url, SCHEMA)
    for i in range(4):
        shard.append(pa.table({"k": [f"k{i}"], "_time": [10 * i]}), lower=10 * i, upper=10 * i + 10, desc_id=f"d{i}")
    lost = shard.stage(pa.table({"k": ["x"], "_time": [5]}), lower=0, upper=10, desc_id="lost")
    shard._machine.blob.put("staging/lost/slot-0.json", b'{"format": 1, "lower": 0, "upper": 10, "desc_id": "lost"}')
    keys = {p.key for p in lost.parts}
    part_bytes = sum(o.size for o in shard._machine.blob.list("parts/lost/") if o.key in keys)
    return shard, keys | {"staging/lost/slot-0.json"}, part_bytes


def test_maintenance_dag_cleans_two_shards_and_reports_their_lineage_and_metrics(moto: MotoServer, af: Env) -> None:
    local_url = (af.root / "shards" / "a").as_uri()
    s3_url = f"s3://shardsink-test/maint-{uuid.uuid4().hex[:10]}"
    shards = [_shard_with_leftovers(u) for u in (local_url, s3_url)]
    heads = {u: Shard.open(u).info().seqno for u in (local_url, s3_url)}
    af.env.update({"SHARDSINK_MAINTENANCE_SHARDS": f"{local_url},{s3_url}", "SHARDSINK_GC_GRACE_S": "0"})
    af.env.update(lineage_env(af.home / "lineage.jsonl"))
    statsd = UdpListener()
    af.env.update(statsd.env())
    try:
        r = dags_test(af.env, "example_maintenance", "2024-01-02")
    finally:
        statsd.close()
    out = ok(r)
    summaries = [ln for ln in out.splitlines() if "SHARDSINK_MAINTENANCE" in ln]
    assert len(summaries) == 2, out[-4000:]
    # rendered for operators: every step as text, never a Python repr
    assert all("compact: " in ln and "verify: ok" in ln and "Result(" not in ln and "{" not in ln
               for ln in summaries), summaries
    for (shard, leftovers, _), url in zip(shards, (local_url, s3_url), strict=True):
        present = {o.key for o in shard._machine.blob.list("")}
        assert not (leftovers & present), f"{url}: leftovers {sorted(leftovers & present)} survived"
        assert any(str(Shard(url).url) in ln and "deleted 2" in ln for ln in summaries), summaries
        assert verify(Shard.open(url)).ok
        assert Shard.open(url).snapshot().num_rows == 4
        # the pass's commits name the DAG run, as an append's do
        new = [c for seqno, c in Shard.open(url).log(limit=50) if seqno > heads[url]]
        writers = {c.writer for c in new}
        assert new and len(writers) == 1 and writers.pop().startswith("airflow:example_maintenance/"), new

    # Lineage: each map index names its own shard as input and output, with the schema and,
    # on completion, the rows and bytes of the live batches after the pass.
    events = lineage_events(read_lineage(af.home / "lineage.jsonl"), "example_maintenance.maintain")
    for url in (local_url, s3_url):
        ds = shard_dataset(url)
        mine = [e for e in events if [(o["namespace"], o["name"]) for o in e["outputs"]] == [(ds.namespace, ds.name)]]
        assert sorted(e["eventType"] for e in mine) == ["COMPLETE", "START"], (url, [e["eventType"] for e in events])
        for e in mine:
            assert [(i["namespace"], i["name"]) for i in e["inputs"]] == [(ds.namespace, ds.name)]
            assert [f["name"] for f in e["outputs"][0]["facets"]["schema"]["fields"]] == ["k"]
        [done] = [e for e in mine if e["eventType"] == "COMPLETE"]
        stats, info = done["outputs"][0]["outputFacets"]["outputStatistics"], Shard.open(url).info().stats
        assert (stats["rowCount"], stats["size"]) == (info.rows, info.bytes) and info.rows == 4

    # Metrics: one value per shard for each name (plain StatsD carries no shard tag: compared as multisets).
    got = statsd.metrics()
    names = Counter(n for n, _ in got)

    def values(name: str) -> list[str]:
        return sorted(v for n, v in got if n == f"airflow.shardsink.{name}")

    assert names["airflow.shardsink.task.maintain.duration"] == 2, got
    assert all(v.endswith("|ms") for v in values("task.maintain.duration"))
    assert values("maintenance.objects_deleted") == ["2|c", "2|c"], got
    assert values("maintenance.part_bytes_deleted") == sorted(f"{b}|c" for _, _, b in shards), got
    assert values("maintenance.batches_before") == ["4|g", "4|g"], got
    assert values("maintenance.batches_after") == sorted(
        f"{Shard.open(u).info().stats.batches}|g" for u in (local_url, s3_url)), got
