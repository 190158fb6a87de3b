"""The maintenance DAG under real `airflow dags test`: dags/example_maintenance.py over two
shards (one in a local folder, one on S3 over HTTP), one mapped task per shard."""

from __future__ import annotations

import subprocess
import uuid

import pyarrow as pa
from af_helpers import VENV_BIN, Env, ok

from shardsink import Shard
from shardsink.maintenance.verify import verify
from shardsink_dev.testing import MotoServer

SCHEMA = pa.schema([("k", pa.string())])


def _shard_with_leftovers(url: str) -> tuple[Shard, set[str]]:
    shard = Shard.create(url, SCHEMA)
    for i in range(4):
        shard.append(pa.table({"k": [f"k{i}"], "_time": [10 * i]}), lower=10 * i, upper=10 * i + 10, desc_id=f"d{i}")
    lost = shard.stage(pa.table({"k": ["x"], "_time": [5]}), lower=0, upper=10, desc_id="lost")
    shard.blob.put("staging/lost/slot-0.json", b'{"lower": 0, "upper": 10, "desc_id": "lost"}')
    return shard, {p.key for p in lost.parts} | {"staging/lost/slot-0.json"}


def test_maintenance_dag_collects_and_verifies_two_shards(moto: MotoServer, af: Env) -> None:
    local_url = (af.root / "shards" / "a").as_uri()
    s3_url = f"s3://shardsink-test/maint-{uuid.uuid4().hex[:10]}"
    shards = [_shard_with_leftovers(u) for u in (local_url, s3_url)]
    af.env.update({"SHARDSINK_MAINTENANCE_SHARDS": f"{local_url},{s3_url}", "SHARDSINK_GC_GRACE_S": "0"})
    r = subprocess.run([str(VENV_BIN / "airflow"), "dags", "test", "example_maintenance", "2024-01-02"],
                       env=af.env, capture_output=True, text=True, timeout=400)
    out = ok(r)
    summaries = [ln for ln in out.splitlines() if "SHARDSINK_MAINTENANCE" in ln]
    assert len(summaries) == 2, out[-4000:]
    for (shard, leftovers), url in zip(shards, (local_url, s3_url), strict=True):
        present = {o.key for o in shard.blob.list("")}
        assert not (leftovers & present), f"{url}: leftovers {sorted(leftovers & present)} survived"
        assert any(str(Shard(url).url) in ln and "deleted 2" in ln for ln in summaries), summaries
        assert verify(Shard.open(url)).ok
        assert Shard.open(url).snapshot().num_rows == 4
