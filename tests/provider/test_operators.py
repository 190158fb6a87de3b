"""The lineage a shardsink task reports (:class:`shardsink.provider.operators.ShardTaskMixin`)
follows schema changes: a column added between two runs is in the next run's lineage.

The shards are real (local folder) and evolved with the real ``shardsink schema`` command
(in-process); the mixin is exercised through the methods the OpenLineage provider calls.
The Airflow runs that send these events are tests/airflow/test_shards_page.py (ingest),
test_materialize_e2e.py (view) and test_maintenance_dag.py (maintenance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.cli import main
from shardsink.provider.operators import ShardTaskMixin

DAY = 86_400_000


class _Task(ShardTaskMixin):
    dag_id = "d"
    task_id = "t"

    def __init__(self, *, role: str, shard_url: str, source_spec: dict[str, Any]) -> None:
        self.shard_role = role  # type: ignore[misc]
        self.shard_url = shard_url
        self.source_spec = source_spec


def _fields(dataset: Any) -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in dataset.facets["schema"].fields]


def test_a_column_added_and_a_rename_appear_in_the_next_runs_lineage_on_every_shard(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, view = f"file://{tmp_path}/src", f"file://{tmp_path}/view"
    for url in (src, view):
        Shard.create(url, pa.schema([("user", pa.string()), ("n", pa.int64())]), upper=DAY)
    maintain = _Task(role="maintain", shard_url=src, source_spec={})
    append = _Task(role="append", shard_url=view, source_spec={"kind": "sql", "inputs": {"a": {"url": src}}})
    before = [("user", "string"), ("n", "int64")]
    for task in (maintain, append):
        ol = task.get_openlineage_facets_on_start()
        assert [_fields(d) for d in (*ol.inputs, *ol.outputs)] == [before, before]

    assert main(["schema", src, "--add", "score:double"]) == 0  # between the runs
    assert main(["schema", src, "--rename", "user:who"]) == 0
    capsys.readouterr()

    after = [("who", "string"), ("n", "int64"), ("score", "double")]
    ol = maintain.get_openlineage_facets_on_complete(None)
    assert [_fields(d) for d in (*ol.inputs, *ol.outputs)] == [after, after]
    ol = append.get_openlineage_facets_on_start()  # the view's input shard changed; its output did not
    assert [_fields(d) for d in (*ol.inputs, *ol.outputs)] == [after, before]
    assert [f.description for f in ol.inputs[0].facets["schema"].fields] == ["field id 1", "field id 2",
                                                                               "field id 3"]
