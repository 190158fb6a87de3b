"""The write operators build their job's command line with the one request encoder: what the
application decodes is exactly the description, slot and typed spec the task was given.

No scheduler, no Spark: the operators are only constructed and asked for their arguments (and
their spark-submit hook, whose configuration they check).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from shardsink.airflow.reprocess import IngestWriteOperator
from shardsink.airflow.view import ViewWriteOperator
from shardsink.errors import InvalidConfigurationError
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
    by = job_shard.request_counter().by_kind
    head_reads = [n for (method, kind), n in by.items() if kind == "state" or (method, kind) == ("list", "state/v")]
    assert sum(head_reads) == 0
    # Without a decision (a job submitted by hand), the job reads the head once and decides itself.
    alone = Shard(url)
    head2, done2 = slot_facts(alone, IngestWriteRequest(shard_url=url, source=req.source, desc=DESC, slot=0, slots=1))
    assert done2 is None and head2.seqno == head.seqno
    by2 = alone.request_counter().by_kind
    assert sum(n for (method, kind), n in by2.items() if kind == "state" and method == "get") == 1


def test_a_missing_spark_connection_or_a_yarn_master_without_its_conf_fails_at_once_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the Spark provider falls back to ``--master yarn`` without a connection, and a
    ``yarn`` master needs HADOOP_CONF_DIR or YARN_CONF_DIR. Both are configuration errors: the
    write task fails when it builds the hook (before spark-submit starts) with an
    AirflowFailException (no Airflow retries), naming the setting; the real provider hook
    resolves the real connections (``AIRFLOW_CONN_*``)."""
    from airflow.sdk.exceptions import AirflowFailException

    for var in ("AIRFLOW_CONN_SPARK_DEFAULT", "HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", '{"conn_type": "spark", "host": "yarn"}')
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    spec = LandingSource(str(tmp_path / "landing")).spec()

    def hook(conn_id: str, env: dict[str, str] | None = None) -> Any:
        return IngestWriteOperator(task_id="write", shard_url="s3://b/shard", source_spec=spec, slots=1, slot=0,
                                   desc=to_builtins(DESC), application="app.py", conn_id=conn_id,
                                   env_vars=env)._get_hook()

    with pytest.raises(AirflowFailException, match=r"^invalid configuration, not retried: InvalidConfigurationError: "
                       r"Spark connection 'spark_default' is not defined .* falls back to --master yarn\. .*"
                       r"AIRFLOW_CONN_SPARK_DEFAULT='\{\"conn_type\": \"spark\", \"host\": \"local\[2\]\"\}'") as e:
        hook("spark_default")
    assert isinstance(e.value.__cause__, InvalidConfigurationError) and e.value.__cause__.value == "spark_default"
    with pytest.raises(AirflowFailException, match=r"Spark connection 'spark_yarn' has master 'yarn', but neither "
                                                   r"HADOOP_CONF_DIR nor YARN_CONF_DIR is set"):
        hook("spark_yarn")
    assert hook("spark_yarn", {"HADOOP_CONF_DIR": str(tmp_path)})._connection["master"] == "yarn"
    monkeypatch.setenv("YARN_CONF_DIR", str(tmp_path))
    assert hook("spark_yarn")._is_yarn
    assert hook("spark_local")._connection["master"] == "local[2]"
    # The worker daemon (shardsink.spark.daemon.daemon_conf): local workers on this interpreter only.
    mine = {"PYSPARK_PYTHON": sys.executable}
    assert hook("spark_local", mine)._conf["spark.python.daemon.module"] == "shardsink.spark.daemon"
    assert "spark.python.daemon.module" not in hook("spark_yarn", mine)._conf
    assert "spark.python.daemon.module" not in hook("spark_local", {"PYSPARK_PYTHON": "/usr/bin/python3"})._conf
    # Decided before spark-submit: the task raises it as is (no "no outcome record" retry path).
    op = IngestWriteOperator(task_id="write", shard_url="s3://b/shard", source_spec=spec, slots=1, slot=0,
                             desc=to_builtins(DESC), application="app.py")
    failed = AirflowFailException("invalid configuration, not retried: ...")
    assert op._failure(str(tmp_path / "no-outcome.json"), failed) is failed
