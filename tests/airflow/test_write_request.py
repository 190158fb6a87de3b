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


def test_the_ingest_operator_passes_the_version_it_decided_at_so_the_job_reads_no_head(tmp_path: Path) -> None:
    """The write task's one head read is the operator's: its fate decision's version goes to the
    job as ``decided_at``, and the job works from that immutable version (no head read, no fate)."""
    import pyarrow as pa

    from shardsink.core.shard import Shard
    from shardsink.spark.job import slot_facts

    url = f"file://{tmp_path}/shard"
    Shard.create(url, pa.schema([("x", pa.int64())]), upper=100)  # DESC [100, 200) may still commit
    src = LandingSource(str(tmp_path / "landing"))
    op = IngestWriteOperator(task_id="write", shard_url=url, source_spec=src.spec(), slots=1, slot=0,
                             desc=to_builtins(DESC), application="app.py")
    assert op.committed_already(DESC) is None
    req = decode_request(op.job_args(DESC)[1], IngestWriteRequest)
    assert req.decided_at == Shard(url).reader().head().seqno
    job_shard = Shard(url)
    head, done = slot_facts(job_shard, req)
    assert done is None and head.seqno == req.decided_at and head.header.upper == 100
    by = job_shard.blob.requests_by_kind  # type: ignore[attr-defined]
    head_reads = [n for (method, kind), n in by.items() if kind == "state" or (method, kind) == ("list", "state/v")]
    assert sum(head_reads) == 0
    # Without a decision (a job submitted by hand), the job reads the head once and decides itself.
    alone = Shard(url)
    head2, done2 = slot_facts(alone, IngestWriteRequest(shard_url=url, source=req.source, desc=DESC, slot=0, slots=1))
    assert done2 is None and head2.seqno == head.seqno
    by2 = alone.blob.requests_by_kind  # type: ignore[attr-defined]
    assert sum(n for (method, kind), n in by2.items() if kind == "state" and method == "get") == 1
