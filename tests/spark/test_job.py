"""The ingest write job (spark/job.py) through a real local spark-submit: its manifest records the
schema id the parts were written with, so a schema change landing before the append does not
relabel them (issue 19 §1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shardsink import Shard
from shardsink.core.schema import SchemaChange
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sources import source_spec
from shardsink.sources.landing import LandingSource
from shardsink.spark import build_pyfiles_zip, job_path
from shardsink.spark.request import IngestWriteRequest, job_argv
from shardsink_dev import jvm
from shardsink_dev.synthetic import generate

BIN = Path(sys.executable).parent
START = 1_704_067_200_000
DAY = 86_400_000


def test_a_slot_staged_before_a_schema_change_appends_under_its_own_schema_id(tmp_path: Path) -> None:
    landing = str(tmp_path / "landing")
    generate(landing, start=START, days=1, files_per_day=2, rows_per_file=50)
    src = LandingSource(landing)
    shard = open_or_create((tmp_path / "shard").as_uri(), src, initial_upper=START)
    chain = mint_chain(shard, src, interval_end=START + DAY, max_span=None, max_chain=1, dag_id="d", run_id="r",
                       attempt=1)
    assert isinstance(chain, list) and isinstance(chain[0], Description)
    d = chain[0]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_SUBMIT_OPTS": jvm.submit_opts(),
           "SPARK_LAUNCHER_OPTS": jvm.launcher_opts()}
    r = subprocess.run([str(BIN / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                        "--py-files", build_pyfiles_zip(tmp_path / "zip"),
                        job_path(), *job_argv(IngestWriteRequest(shard_url=shard.url, source=source_spec(src),
                                                                 desc=d, slot=0, slots=1))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    doc = shard.writer().get_manifest(d.desc_id, 0)
    assert doc is not None and doc.schema_id == 0
    old = shard.schema.names
    shard.evolve(SchemaChange(kind="add", name="note", type="string"))
    shard.evolve(SchemaChange(kind="rename", name=old[1], new_name="renamed"))
    res = append_from_manifests(shard, d, 1)
    assert res.status == "committed" and res.rows == 100
    assert [b.schema_id for b in shard.batches()] == [0]
    snap = Shard.open(shard.url).snapshot()
    assert snap.column_names == [old[0], "renamed", *old[2:], "note", "_count"]
    assert sum(snap["_count"].to_pylist()) == 100 and snap["note"].null_count == snap.num_rows
    assert snap["renamed"].null_count < snap.num_rows
