"""The OpenLineage datasets of shardsink tasks: every shard carries its CURRENT schema.

Shards are real (local folder) and evolved with the real ``shardsink schema --add/--rename``
(in-process :func:`shardsink.cli.main`); the facets are the OpenLineage client's own,
serialised as the provider sends them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.cli import main
from shardsink.errors import ShardsinkError
from shardsink.provider import lineage
from shardsink.provider.lineage import Column, DatasetName, ReportedDataset

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
DAY = 86_400_000


def evolved_shard(url: str, capsys: pytest.CaptureFixture[str]) -> Shard:
    """A shard with one batch, then ``--add score:double`` and ``--rename user:who`` (schema ids 1, 2)."""
    shard = Shard.create(url, SCHEMA, upper=DAY)
    shard.append(pa.table({"user": ["a", "b"], "n": [1, 2], "_time": [DAY, DAY]}), lower=DAY, upper=2 * DAY)
    assert main(["schema", url, "--add", "score:double"]) == 0
    assert main(["schema", url, "--rename", "user:who"]) == 0
    capsys.readouterr()
    return shard


EVOLVED = (Column("who", "string", "field id 1"), Column("n", "int64", "field id 2"),
           Column("score", "double", "field id 3"))


def test_shard_columns_are_the_current_schema_after_add_and_rename_without_time_and_diff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/s"
    assert lineage.shard_columns(url) is None  # not created yet
    Shard.create(url, pa.schema([pa.field("user", pa.string(), nullable=False)]), upper=0)
    assert lineage.shard_columns(url) == (Column("user", "string", "field id 1, not null"),)
    other = f"file://{tmp_path}/e"
    evolved_shard(other, capsys)
    assert lineage.shard_columns(other) == EVOLVED  # field ids survive the rename; no _time/_diff


def test_input_datasets_give_a_views_input_shards_their_current_schema(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, missing = f"file://{tmp_path}/in", f"file://{tmp_path}/missing"
    evolved_shard(url, capsys)
    view = {"kind": "sql", "inputs": {"a": {"url": url, "mode": "updates"}, "b": {"url": missing}}}
    assert lineage.input_datasets(view) == [ReportedDataset(DatasetName("file", f"{tmp_path}/in"), EVOLVED),
                                            ReportedDataset(DatasetName("file", f"{tmp_path}/missing"), None)]
    assert lineage.input_datasets({"kind": "landing", "root": "/srv/landing"}) == [
        ReportedDataset(DatasetName("file", "/srv/landing"), None)]


def test_an_input_shard_whose_schema_cannot_be_read_is_still_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"file://{tmp_path}/broken"
    Shard.create(url, SCHEMA)
    for f in (tmp_path / "broken" / "state").rglob("*.json"):
        f.write_text("not json")
    with pytest.raises(ShardsinkError):  # a corrupt state: not a missing shard
        lineage.shard_columns(url)
    assert lineage.input_datasets({"inputs": {"a": {"url": url}}}) == [
        ReportedDataset(DatasetName("file", f"{tmp_path}/broken"), None)]
    assert "could not read the schema of input shard" in caplog.text


def _as_sent(dataset: Any) -> dict[str, Any]:
    """A dataset as the OpenLineage client serialises it into an event."""
    from openlineage.client.serde import Serde

    out: dict[str, Any] = Serde.to_dict(dataset)
    return out


def test_operator_lineage_puts_the_schema_facet_on_every_shard_dataset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path}/s"
    evolved_shard(url, capsys)
    shard = ReportedDataset(lineage.shard_dataset(url), lineage.shard_columns(url))
    landing = ReportedDataset(DatasetName("file", "/srv/landing"))
    ol = lineage.operator_lineage(output=shard, inputs=[landing, shard], rows=2, size=10)
    [src, again] = ol.inputs
    assert (src.namespace, src.name, src.facets) == ("file", "/srv/landing", {})  # no schema for a landing zone
    [out] = ol.outputs
    for d in (again, out):
        assert (d.namespace, d.name) == ("file", f"{tmp_path}/s")
        fields = _as_sent(d)["facets"]["schema"]["fields"]
        assert [(f["name"], f["type"], f["description"]) for f in fields] == [
            ("who", "string", "field id 1"), ("n", "int64", "field id 2"), ("score", "double", "field id 3")]
    assert _as_sent(out)["outputFacets"]["outputStatistics"]["rowCount"] == 2
