"""The write operators build their job's command line with the one request encoder: what the
application decodes is exactly the description, slot and typed spec the task was given.

No scheduler, no Spark: the operators are only constructed and asked for their arguments.
"""

from __future__ import annotations

from pathlib import Path

from shardsink.airflow.reprocess import IngestWriteOperator
from shardsink.airflow.view import ViewWriteOperator
from shardsink.sinks.description import Description, to_builtins
from shardsink.sources import LandingSource, source_spec
from shardsink.spark.request import (
    REQUEST_OPTION,
    IngestCorrectRequest,
    IngestWriteRequest,
    ViewWriteRequest,
    decode_request,
)

DESC = Description(desc_id="d-r-a1-0123abcd", lower=100, upper=200, attempt=2)


def test_the_ingest_operator_sends_the_typed_request_of_its_slot(tmp_path: Path) -> None:
    src = LandingSource(str(tmp_path / "landing"))
    for spec in (src.spec(), source_spec(src)):  # a DAG's dict spec, or the typed one
        op = IngestWriteOperator(task_id="write", shard_url="s3://b/shard", source_spec=spec, slots=3, slot=2,
                                 desc=to_builtins(DESC), application="app.py")
        argv = op.job_args(DESC)
        assert argv[0] == REQUEST_OPTION and len(argv) == 2
        assert decode_request(argv[1], IngestWriteRequest) == IngestWriteRequest(
            shard_url="s3://b/shard", source=source_spec(src), desc=DESC, slot=2, slots=3)
        assert op.source_spec == src.spec()  # plain values: mapped operators' arguments are serialized
    correcting = Description(desc_id="d2", lower=200, upper=300, attempt=1, corrects=(0, 100))
    req = decode_request(op.job_args(correcting)[1], IngestCorrectRequest)
    assert req.desc == correcting and (req.slot, req.slots) == (0, 1) and req.source == source_spec(src)


def test_the_view_operator_sends_the_view_spec() -> None:
    view = {"sql": "select 1 as x", "inputs": {"a": "s3://b/a"}}
    op = ViewWriteOperator(task_id="write", shard_url="s3://b/view", view_spec=view, desc=to_builtins(DESC), slot=0,
                           application="app.py")
    assert decode_request(op.job_args(DESC)[1], ViewWriteRequest) == ViewWriteRequest(
        shard_url="s3://b/view", view=view, desc=DESC)
