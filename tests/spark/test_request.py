"""The spark-submit request: one typed struct per job, one encoder, one decoder.

Every request round-trips through its command line; a request that does not decode, has a
newer format, or is sent to another job's application is refused as invalid input naming
the field, and the application reports it as its outcome record (exit 2) before any Spark.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from shardsink.errors import InvalidUsageError
from shardsink.outcome import read_outcome
from shardsink.sinks.description import Description
from shardsink.spark.entrypoint import jobs_dir
from shardsink.spark.request import (
    FORMAT,
    REQUEST_OPTION,
    IngestCorrectRequest,
    IngestWriteRequest,
    JobRequest,
    ViewWriteRequest,
    decode_request,
    encode_request,
    job_argv,
)
from shardsink.specs import CustomSpec, KafkaSpec, LandingSpec

DESC = Description(desc_id="d-r-a1-0123abcd", lower=100, upper=200, attempt=2)
LANDING = LandingSpec(root="s3://b/landing", schema={"arrow": "x"})


def _job(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"spark_job_{name}", jobs_dir() / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REQUESTS: list[JobRequest] = [
    IngestWriteRequest(shard_url="s3://b/shard", source=LANDING, desc=DESC, slot=1, slots=3),
    IngestWriteRequest(shard_url="s3://b/shard", source=LANDING, desc=DESC, slot=0, slots=1, part_order="unordered"),
    IngestWriteRequest(shard_url="s3://b/shard", desc=DESC, slot=0, slots=1,
                       source=CustomSpec(target="my.mod:Src", options={"remap": "s3://b/r", "n": [1, 2]})),
    IngestCorrectRequest(shard_url="s3://b/shard",
                         desc=Description(desc_id="d", lower=100, upper=200, attempt=1, corrects=(10, 50)),
                         source=KafkaSpec(bootstrap="h:1", topic="t", remap="s3://b/remap", route_by="team",
                                          outputs={"a": "s3://b/a"}, output="a")),
    ViewWriteRequest(shard_url="s3://b/view", desc=DESC, view={"sql": "select 1 as x", "inputs": {}}),
    ViewWriteRequest(shard_url="s3://b/view", desc=DESC, view={"sql": "select 1 as x", "inputs": {}}, decided_at=7),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips_through_its_command_line(req: JobRequest) -> None:
    argv = job_argv(req, result_path="/tmp/outcome.json")
    assert argv == [REQUEST_OPTION, encode_request(req), "--result-path", "/tmp/outcome.json"]
    assert decode_request(argv[1], type(req)) == req
    assert json.loads(argv[1])["format"] == FORMAT


def test_a_bad_request_is_refused_naming_the_field() -> None:
    good = json.loads(encode_request(REQUESTS[0]))
    cases: list[tuple[dict[str, object], str]] = [
        ({k: v for k, v in good.items() if k != "slot"}, r"missing required field `slot`"),
        ({**good, "desc": {**good["desc"], "lower": "100"}}, r"Expected `int`, got `str` - at `\$\.desc\.lower`"),
        ({**good, "source": {**good["source"], "root": 7}}, r"at `\$\.source\.root`"),
        ({**good, "source": {"kind": "nope"}}, r"`\$\.source\.kind`"),
        ({**good, "format": "shardsink.job-request/9"}, r"unsupported format.*`\$\.format`"),
        ({**good, "job": "view_write"}, r"missing required field `view`"),
        ({**good, "slot": 3}, r"slot 3 is not in \[0, 3\) - at `\$\.slot`"),
        ({**good, "part_order": "shuffled"}, r"at `\$\.part_order`"),
    ]
    for doc, match in cases:
        with pytest.raises(InvalidUsageError, match=match):
            decode_request(json.dumps(doc), IngestWriteRequest)
    view = encode_request(REQUESTS[4])
    with pytest.raises(InvalidUsageError, match=r"job 'view_write' sent to the 'ingest_write' application"):
        decode_request(view, IngestWriteRequest)
    with pytest.raises(InvalidUsageError, match=r"decided_at -1 is not a seqno.*`\$\.decided_at`"):
        decode_request(json.dumps({**json.loads(view), "decided_at": -1}), ViewWriteRequest)
    no_range = IngestCorrectRequest(shard_url="s3://b/shard", source=LANDING, desc=DESC)
    with pytest.raises(InvalidUsageError, match=r"`\$\.desc\.corrects`"):
        decode_request(encode_request(no_range), IngestCorrectRequest)
    with pytest.raises(InvalidUsageError, match="not JSON"):
        decode_request("--shard-url", IngestWriteRequest)


def test_a_write_request_without_a_part_order_from_an_older_operator_stages_sorted_parts() -> None:
    doc = json.loads(encode_request(REQUESTS[1]))
    assert doc["part_order"] == "unordered"
    del doc["part_order"]
    assert decode_request(json.dumps(doc), IngestWriteRequest).part_order == "sorted"


@pytest.mark.parametrize("name", ["ingest_write", "ingest_correct", "view_write"])
def test_an_application_reports_a_bad_request_as_invalid_input_before_any_spark(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = json.loads(encode_request(REQUESTS[0]))
    del bad["shard_url"]
    result = tmp_path / "outcome.json"
    assert _job(name).main([REQUEST_OPTION, json.dumps(bad), "--result-path", str(result)]) == 2
    outcome = read_outcome(result)
    assert outcome is not None and not outcome.ok and outcome.error is not None
    assert outcome.error.error_class == "InvalidUsageError"
    assert "missing required field `shard_url`" in outcome.error.message
    assert "shardsink: error: InvalidUsageError" in capsys.readouterr().err


def test_a_correction_request_carries_the_schema_mode_and_an_older_one_reads_strictly() -> None:
    corr = Description(desc_id="d", lower=100, upper=200, attempt=1, corrects=(10, 50))
    req = IngestCorrectRequest(shard_url="s3://b/shard", source=LANDING, desc=corr, schema_mode="add_columns")
    doc = json.loads(encode_request(req))
    assert doc["schema_mode"] == "add_columns"
    assert decode_request(json.dumps(doc), IngestCorrectRequest).schema_mode == "add_columns"
    del doc["schema_mode"]
    assert decode_request(json.dumps(doc), IngestCorrectRequest).schema_mode == "strict"
    with pytest.raises(InvalidUsageError, match=r"`\$\.schema_mode`"):
        decode_request(json.dumps({**doc, "schema_mode": "merge"}), IngestCorrectRequest)
