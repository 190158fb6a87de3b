"""Dry runs (:func:`shardsink.spark.dryrun.dry_run_ingest`) under ``schema_mode`` on the shared
local Spark session, with real Parquet landing files: under ``"add_columns"`` a dry run reports
the schema changes the run would commit and reads the files onto that uncommitted schema; the
store stays byte-identical (no schema commit, no part, no manifest)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from test_reprocess_evolving import START, correct, landed_and_committed, with_country

from shardsink.sinks.description import Description
from shardsink.sources.landing import read_landing_file
from shardsink.spark.dryrun import dry_run_ingest, totals
from shardsink_dev.synthetic import DAY, land_file, landing_table, publish_watermark


def _store(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dry_run_under_add_columns_reports_the_column_it_would_add_and_writes_nothing(
        spark: Any, tmp_path: Path) -> None:
    src, shard = landed_and_committed(tmp_path)
    day1 = read_landing_file(src.blob(), next(f for f in src.files() if f.key == "day1.parquet"), None,
                             "event_time").slice(5)  # the producer dropped 5 rows: a first, strict correction
    day1 = day1.rename_columns([*day1.column_names[:-1], "event_time"])
    land_file(src.root, "day1.parquet", day1)
    first = Description(desc_id="fix1", lower=START + 2 * DAY, upper=START + 3 * DAY, attempt=1,
                        corrects=(START, START + DAY))
    assert correct(spark, src, shard, first, "strict") == 5
    land_file(src.root, "day1.parquet", with_country(day1))  # ... then re-landed it with the new column
    land_file(src.root, "day4.parquet", landing_table(START + 3 * DAY, START + 4 * DAY, 8, seed=4))
    publish_watermark(src.root, START + 4 * DAY)
    fix_day_1 = Description(desc_id="fix2", lower=START + 3 * DAY, upper=START + 4 * DAY, attempt=1,
                            corrects=(START, START + DAY))
    store = _store(tmp_path / "shard")

    with pytest.raises(Exception, match=r"day1\.parquet: columns do not match the shard.*unexpected \['country'\]"):
        dry_run_ingest(spark, src, shard, [fix_day_1], slots=1)
    report = totals(dry_run_ingest(spark, src, shard, [fix_day_1], slots=1, sample=3, schema_mode="add_columns"))

    assert report["schema_changes"] == ["would add column country: string"]
    assert [x["what"] for x in report["lines"]] == ["schema", "ingest", "correction"]
    schema, ingest, corr = report["lines"]
    assert (schema["updates"], schema["parts"], report["descriptions"]) == (0, 0, 1)
    assert ingest["updates"] == 8 and all(r["country"] is None for r in ingest["sample"])  # day 4: no country
    # The shard holds day 1's 15 rows (20 appended, 5 retracted by the earlier correction, read as
    # its holdings onto the uncommitted schema): each is replaced by itself with its country.
    assert (corr["inserts"], corr["retractions"]) == (15, 15), "day 1 replaced, now with its country"
    assert len(corr["sample"]) == 3 and all("country" in r for r in corr["sample"])
    assert _store(tmp_path / "shard") == store, "a dry run writes nothing, the schema included"
    assert len(shard.schema_history()) == 1 and shard.info().upper == START + 3 * DAY


def test_the_headline_lists_schema_changes_only_when_a_line_has_some() -> None:
    line = {"what": "ingest", "desc_id": "d", "updates": 3, "bytes": 9}
    assert "schema_changes" not in totals([line])
    schema = {**line, "what": "schema", "updates": 0, "bytes": 0, "schema_changes": ["would add column x: int64"]}
    both = totals([schema, line])
    assert both["schema_changes"] == ["would add column x: int64"] and both["updates"] == 3
    assert both["descriptions"] == 1
