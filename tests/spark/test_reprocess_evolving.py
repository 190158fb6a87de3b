"""Re-processing under ``schema_mode`` (issue 19): the correction job's staging
(:func:`shardsink.spark.reprocess.stage_correction`) on the shared local Spark session, with
real Parquet landing files, committed through the manifests as the append task does.

* A correction that re-reads older files (which lack the column the shard gained) reads
  them strictly only under ``"strict"`` (and fails, naming the missing column); under
  ``"add_columns"`` they read nulls and an unchanged range corrects nothing.
* A re-processed day whose re-landed files gained a column: the mint's evolution adds it
  before the correction; the correction then replaces the day's rows with the column filled.
  Without that evolution the correction is refused: no rows with unknown columns commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core.schema import current as current_schema
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sinks.evolve import evolve_for_source
from shardsink.sinks.staging import write_manifest
from shardsink.sources.evolution import SchemaMode
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink.spark.reprocess import stage_correction
from shardsink_dev.synthetic import DAY, SCHEMA, land_file, landing_table, publish_watermark

START = 1_704_067_200_000
COUNTRIES = ["nl", "de", "fr", "be"]


def with_country(t: pa.Table) -> pa.Table:
    return t.append_column("country", pa.array([COUNTRIES[i % 4] for i in range(t.num_rows)]))


def landed_and_committed(tmp_path: Path, *, days: int = 2) -> tuple[LandingSource, Shard]:
    """Days 1-3 landed (20, 12, 8 rows), watermark at day 3's end; the first ``days`` committed
    one batch a day under the shard's first schema (no JVM)."""
    landing = str(tmp_path / "landing")
    for i, n in enumerate((20, 12, 8)):
        land_file(landing, f"day{i + 1}.parquet", landing_table(START + i * DAY, START + (i + 1) * DAY, n, seed=i))
    publish_watermark(landing, START + 3 * DAY)
    src = LandingSource(landing)
    shard = Shard.create((tmp_path / "shard").as_uri(), SCHEMA, upper=START)
    for i in range(days):
        f = next(f for f in src.files() if f.key == f"day{i + 1}.parquet")
        lo, hi = START + i * DAY, START + (i + 1) * DAY
        staged = shard.stage(read_landing_file(src.blob(), f, SCHEMA, "event_time"), lower=lo, upper=hi,
                             desc_id=f"day{i + 1}")
        shard.compare_and_append([staged], expected_upper=lo, new_upper=hi, desc_id=f"day{i + 1}")
    return src, shard


def correct(spark: Any, src: LandingSource, shard: Shard, desc: Description, mode: SchemaMode) -> int:
    """Stage ``desc`` whole as the correction job does (schema and id from one head read) and
    commit it from its manifest as the append task does; returns the correction's rows."""
    header = shard.reader().head().header
    parts, inputs, _ = stage_correction(spark, src, shard, desc, schema=header.schema, schema_mode=mode)
    write_manifest(shard, desc, slot=0, slots=1, parts=parts, inputs=inputs, schema_id=current_schema(header).id)
    append_from_manifests(shard, desc, 1)
    assert desc.corrects is not None
    fixes = [p for b in shard.batches() for p in b.parts if p.corrected_range() == desc.corrects]
    assert all(p.corrects == desc.corrects for p in fixes), "the committed correction parts record their range"
    return sum(p.rows for p in fixes)


def test_after_an_evolution_a_correction_of_older_files_reads_them_with_nulls_under_add_columns(
        spark: Any, tmp_path: Path) -> None:
    src, shard = landed_and_committed(tmp_path)
    land_file(src.root, "day3.parquet", with_country(landing_table(START + 2 * DAY, START + 3 * DAY, 8, seed=2)))
    assert [c.describe() for c in evolve_for_source(shard, src, writer="mint")] == ["add country:string"]
    fix_day_2 = Description(desc_id="fix2", lower=START + 2 * DAY, upper=START + 3 * DAY, attempt=1,
                            corrects=(START + DAY, START + 2 * DAY))
    before = shard.info().seqno

    with pytest.raises(Exception, match=r"day[12]\.parquet: columns do not match the shard: missing \['country'\]"):
        stage_correction(spark, src, shard, fix_day_2, schema=shard.schema, schema_mode="strict")
    assert shard.info().seqno == before

    assert correct(spark, src, shard, fix_day_2, "add_columns") == 0, "an unchanged day corrects nothing"
    assert shard.info().upper == START + 3 * DAY
    day2 = shard.changes(START + DAY, START + 2 * DAY)
    day3 = shard.changes(START + 2 * DAY, START + 3 * DAY)
    assert day2.num_rows == 12 and day2["country"].null_count == 12
    assert sorted(day3["country"].to_pylist()) == sorted(COUNTRIES * 2)
    assert sum(shard.snapshot(START + 3 * DAY - 1)["_count"].to_pylist()) == 40


def test_a_reprocessed_day_whose_files_gained_a_column_is_replaced_only_after_the_evolution(
        spark: Any, tmp_path: Path) -> None:
    src, shard = landed_and_committed(tmp_path)
    day1 = read_landing_file(src.blob(), next(f for f in src.files() if f.key == "day1.parquet"), None,
                             "event_time")
    relanded = with_country(day1.rename_columns([*day1.column_names[:-1], "event_time"]))
    land_file(src.root, "day1.parquet", relanded)  # the producer re-landed day 1 with the new column
    fix_day_1 = Description(desc_id="fix1", lower=START + 2 * DAY, upper=START + 3 * DAY, attempt=1,
                            corrects=(START, START + DAY))
    before = shard.info().seqno

    # No evolution before the correction (a file re-landed after the mint): refused, naming
    # the file and the column, rather than dropping the column from the committed rows.
    with pytest.raises(Exception, match=r"day1\.parquet: has columns \['country'\] the shard does not know"):
        stage_correction(spark, src, shard, fix_day_1, schema=shard.schema, schema_mode="add_columns")
    assert shard.info().seqno == before and shard.writer().get_manifest("fix1", 0) is None

    evolve_for_source(shard, src, writer="mint")  # what the add_columns mint does before the write tasks
    assert correct(spark, src, shard, fix_day_1, "add_columns") == 40, "20 retractions + 20 insertions"
    snap = shard.snapshot(START + 3 * DAY - 1)
    assert sum(snap["_count"].to_pylist()) == 40
    got = sorted((r["user"], r["action"], r["amount"], r["country"]) for r in snap.to_pylist()
                 if r["country"] is not None for _ in range(r["_count"]))
    want = sorted((r["user"], r["action"], r["amount"], r["country"]) for r in relanded.to_pylist())
    assert got == want, "day 1 now reads as re-landed, country filled"
    assert [b.schema_id for b in shard.batches()] == [0, 0, 1]

    # The same day again: the earlier correction (schema id 1) counts as the shard's holdings.
    land_file(src.root, "day4.parquet", landing_table(START + 3 * DAY, START + 4 * DAY, 8, seed=4))
    publish_watermark(src.root, START + 4 * DAY)
    again = Description(desc_id="fix1b", lower=START + 3 * DAY, upper=START + 4 * DAY, attempt=1,
                        corrects=(START, START + DAY))
    assert correct(spark, src, shard, again, "add_columns") == 40, "no new correction rows"
    assert sum(shard.snapshot(START + 4 * DAY - 1)["_count"].to_pylist()) == 48


def test_the_correction_job_reads_as_its_request_says(tmp_path: Path) -> None:
    """The request's mode reaches the correction through a real spark-submit of
    ``spark_jobs/ingest_correct.py`` (one JVM): after the evolution, re-reading day 2 (no
    country) stages under the evolved schema id and commits."""
    import os
    import subprocess
    import sys

    from shardsink.outcome import read_outcome
    from shardsink.sources import source_spec
    from shardsink.spark import build_pyfiles_zip
    from shardsink.spark.entrypoint import job_file
    from shardsink.spark.request import IngestCorrectRequest, job_argv
    from shardsink_dev import jvm

    src, shard = landed_and_committed(tmp_path)
    land_file(src.root, "day3.parquet", with_country(landing_table(START + 2 * DAY, START + 3 * DAY, 8, seed=2)))
    evolve_for_source(shard, src, writer="mint")
    fix_day_2 = Description(desc_id="fix2", lower=START + 2 * DAY, upper=START + 3 * DAY, attempt=1,
                            corrects=(START + DAY, START + 2 * DAY))
    req = IngestCorrectRequest(shard_url=shard.url, source=source_spec(src), desc=fix_day_2, schema_mode="add_columns")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_SUBMIT_OPTS": jvm.submit_opts(),
           "SPARK_LAUNCHER_OPTS": jvm.launcher_opts()}
    result = tmp_path / "outcome.json"
    r = subprocess.run([str(bin_dir / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                        "--py-files", build_pyfiles_zip(tmp_path / "zip"), job_file("ingest_correct"),
                        *job_argv(req, result_path=str(result))], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    outcome = read_outcome(result)
    assert outcome is not None and outcome.ok
    doc = shard.writer().get_manifest("fix2", 0)
    assert doc is not None and doc.schema_id == 1
    assert append_from_manifests(shard, fix_day_2, 1).status == "committed"
    assert sorted(shard.changes(START + 2 * DAY, START + 3 * DAY)["country"].to_pylist()) == sorted(COUNTRIES * 2)
    assert shard.changes(START + DAY, START + 2 * DAY)["country"].null_count == 12
