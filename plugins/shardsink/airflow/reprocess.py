"""Re-processing and dry runs under Airflow: the run params and the correction operator.

Params (DAG params, overridden by a run's conf, e.g. ``airflow dags trigger -c`` or
``airflow backfill create --dag-run-conf``):

* ``dry_run`` (bool): compute and report what the run would write; write nothing.
* ``reprocess_from`` / ``reprocess_to`` (ms or ISO date/time, UTC if no zone): re-process
  the sealed range ``[from, to)``: the run appends its correction (see
  :mod:`shardsink.sinks.reprocess`).
* ``reprocess`` (bool): re-process the run's own data interval (use with
  ``airflow backfill create --reprocess-behavior completed --dag-run-conf '{"reprocess": true}'``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowSkipException

from shardsink.airflow.write_operator import ShardWriteOperator
from shardsink.sinks.description import Description
from shardsink.sources.evolution import SchemaMode, check_schema_mode
from shardsink.spark.request import IngestCorrectRequest, IngestWriteRequest, JobRequest
from shardsink.specs import spec_from_builtins


def run_params(*, reprocess: bool) -> dict[str, Param]:
    """The DAG params of a sink DAG (``reprocess``: the ingest DAG's re-processing params too)."""
    out = {"dry_run": Param(False, type="boolean", description="compute and report what the run would write; "
                                                                "write nothing")}
    if reprocess:
        when = ["null", "string", "integer"]
        out.update({
            "reprocess_from": Param(None, type=when, description="re-process a sealed range from (ms or ISO, UTC)"),
            "reprocess_to": Param(None, type=when, description="... to (exclusive; ms or ISO, UTC)"),
            "reprocess": Param(False, type="boolean", description="re-process this run's own data interval"),
        })
    return out


def correction_job_path() -> str:
    """The spark-submit application of the correction step (``spark_jobs/ingest_correct.py``)."""
    from shardsink.spark.entrypoint import job_file

    return job_file("ingest_correct")


class IngestWriteOperator(ShardWriteOperator):
    """The ingest DAG's write operator: :class:`ShardWriteOperator` for ordinary descriptions; for
    the description of a re-processing run that carries the correction, slot 0 runs the
    correction job (:mod:`shardsink.spark.reprocess`), which stages ALL of that description
    (its ordinary source rows and the correction, as slot 0 of 1), and the other slots skip.

    ``schema_mode`` (``ingest_dag``'s, :mod:`shardsink.sources.evolution`): both requests carry
    it, so the write job and the correction job read each file onto the shard's schema alike
    (under ``"add_columns"`` the mint evolved the shard first; columns a file lacks read null).
    """

    stages_corrections = True

    def __init__(self, *, schema_mode: SchemaMode = "strict", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schema_mode: SchemaMode = check_schema_mode(schema_mode)

    def job_request(self, d: Description) -> JobRequest:
        if d.corrects is None:
            req = super().job_request(d)
            return msgspec.structs.replace(req, schema_mode=self.schema_mode) \
                if isinstance(req, IngestWriteRequest) else req
        return IngestCorrectRequest(shard_url=self.shard_url, source=spec_from_builtins(self.source_spec), desc=d,
                                    schema_mode=self.schema_mode)

    def execute(self, context: Any) -> None:
        if self.desc and Description.decode(self.desc).corrects is not None:
            if self.slot != 0:
                raise AirflowSkipException("slot 0 stages this correcting description whole")
            self.application = correction_job_path()
        super().execute(context)
