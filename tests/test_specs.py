"""Source specs are a tagged union of structs whose JSON is the dict layout specs always had:
specs written before the structs decode, what is written now is read by the old codecs'
rules (defaults left out), a spec that does not fit its kind is refused naming the field,
and kinds registered at run time travel as CustomSpec in their own layout."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from shardsink.errors import InvalidUsageError
from shardsink.sources import LandingSource, source_from_spec, source_spec
from shardsink.sources.files import FileArrivals
from shardsink.sources.kafka import KafkaSource
from shardsink.specs import (
    CustomSpec,
    FilesSpec,
    KafkaSpec,
    LandingSpec,
    SourceSpec,
    spec_as,
    spec_from_builtins,
    spec_to_builtins,
)

SCHEMA = pa.schema([pa.field("user", pa.string()), pa.field("n", pa.int64())])

#: Exactly what the dict codecs wrote before the structs (every key, nulls included).
OLD_KAFKA = {"kind": "kafka", "bootstrap": "127.0.0.1:9092", "topic": "events", "remap": "s3://b/remap",
             "group_id": "shardsink-events", "offset_columns": False, "probe": "fetch", "chunk": 50000,
             "read_timeout_s": 60.0, "outputs": {"a": "s3://b/a", "b": "s3://b/b"}, "route_by": "team",
             "output": None}
OLD_FILES = {"kind": "files", "root": "s3://b/in", "remap": "s3://b/remap", "settle_seconds": 30.0}
OLD_LANDING = {"kind": "landing", "root": "s3://b/landing", "time_column": "event_time"}


@pytest.mark.parametrize("old", [OLD_KAFKA, OLD_FILES, OLD_LANDING])
def test_specs_written_by_the_dict_codecs_decode_to_their_kind(old: dict[str, object]) -> None:
    typed = spec_from_builtins(json.loads(json.dumps(old)))
    assert type(typed) is {"kafka": KafkaSpec, "files": FilesSpec, "landing": LandingSpec}[str(old["kind"])]
    # The dict layout is the tagged encoding; only values equal to the defaults are left out.
    again = spec_to_builtins(typed)
    assert again == {k: v for k, v in old.items() if k in again}
    assert spec_from_builtins(again) == typed
    assert msgspec.json.decode(msgspec.json.encode(typed), type=SourceSpec) == typed


def test_every_source_round_trips_through_its_typed_spec(tmp_path: Path) -> None:
    srcs = [
        LandingSource(str(tmp_path / "landing"), time_column="ts", schema=SCHEMA),
        FileArrivals(str(tmp_path / "in"), remap=(tmp_path / "remap").as_uri(), settle_seconds=0, schema=SCHEMA),
        KafkaSource("h:1", "t", remap=(tmp_path / "remap").as_uri(), client={"api_version": [3, 5]}, chunk=7,
                    probe="end_offsets", schema=SCHEMA),
    ]
    for src in srcs:
        typed = source_spec(src)
        assert type(typed) is type(src).spec_type  # type: ignore[attr-defined]
        wire = msgspec.json.decode(msgspec.json.encode(typed), type=SourceSpec)
        again = source_from_spec(wire)
        assert type(again) is type(src) and again.spec() == src.spec() and again.schema() == SCHEMA
        assert source_from_spec(json.loads(json.dumps(src.spec()))).spec() == src.spec()


def test_a_spec_that_does_not_fit_its_kind_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidUsageError, match=r"kind 'kafka'.*`\$\.chunk`"):
        spec_from_builtins({**OLD_KAFKA, "chunk": "many"})
    with pytest.raises(InvalidUsageError, match=r"kind 'files'.*missing required field `remap`"):
        source_from_spec({"kind": "files", "root": "/x"})
    with pytest.raises(InvalidUsageError, match=r"kind 'kafka'.*`\$\.probe`"):
        spec_from_builtins({**OLD_KAFKA, "probe": "guess"})
    with pytest.raises(InvalidUsageError, match="has no 'kind'"):
        spec_from_builtins({"root": "/x"})
    with pytest.raises(InvalidUsageError, match="'files' spec is not a 'landing' spec"):
        spec_as(spec_from_builtins(OLD_FILES), LandingSpec)


def test_kinds_registered_at_run_time_travel_as_custom_specs_in_their_own_layout() -> None:
    flat = {**OLD_KAFKA, "kind": "tests.elsewhere:Growing", "visible_file": "/tmp/n"}
    typed = spec_from_builtins(flat)
    assert isinstance(typed, CustomSpec) and typed.target == "tests.elsewhere:Growing"
    assert typed.options["visible_file"] == "/tmp/n"
    assert spec_to_builtins(typed) == flat
    assert msgspec.json.decode(msgspec.json.encode(typed), type=SourceSpec) == typed
    # A subclass reads its base's fields from its own layout, whatever its kind says.
    assert spec_as(typed, KafkaSpec).topic == "events"
    with pytest.raises(InvalidUsageError, match="cannot import"):
        source_from_spec(typed)


def test_a_spec_never_carries_a_credential() -> None:
    # Specs travel in DAG settings, on the spark-submit command line and in sidecars.
    with pytest.raises(InvalidUsageError, match=r"\['sasl_plain_password'\] look like credentials"):
        source_from_spec({**OLD_KAFKA, "remap": "s3://bucket/remap", "outputs": {},
                          "client": {"security_protocol": "SASL_SSL", "sasl_plain_password": "x"}})
