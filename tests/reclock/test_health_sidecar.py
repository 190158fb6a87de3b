"""The reclock sidecar is typed: a sidecar written by the dict codecs decodes to its source's
spec struct, one of a kind registered at run time keeps its own layout, and a source spec
that does not fit its kind is a CorruptionError naming the object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsink.errors import CorruptionError
from shardsink.reclock import health
from shardsink.specs import CustomSpec, FilesSpec, KafkaSpec, spec_to_builtins
from shardsink.storage.url import open_blob

#: What the dict codecs wrote (json.dumps(sort_keys=True) of the old spec(), before formats).
OLD_ROUTED_KAFKA = (b'{"remap": "s3://b/remap", "source": {"bootstrap": "h:9092", "chunk": 50000, "group_id": '
                    b'"shardsink-t", "kind": "kafka", "offset_columns": false, "output": "a", "outputs": {"a": '
                    b'"s3://b/a", "b": "s3://b/b"}, "probe": "fetch", "read_timeout_s": 60.0, "remap": '
                    b'"s3://b/remap", "route_by": "team", "topic": "t"}}')
OLD_FILES = (b'{"format": 1, "remap": "s3://b/remap", "source": {"kind": "files", "remap": "s3://b/remap", '
             b'"root": "s3://b/in", "schema": {"arrow": "x"}, "settle_seconds": 5.0}}')


def test_a_sidecar_written_by_the_dict_codecs_decodes_typed(tmp_path: Path) -> None:
    url = (tmp_path / "data").as_uri()
    blob = open_blob(url)
    blob.put(health.SIDECAR_KEY, OLD_ROUTED_KAFKA)
    doc = health.read_sidecar_doc(url)
    assert doc is not None and doc.remap == "s3://b/remap" and doc.format == 1
    assert doc.source == KafkaSpec(bootstrap="h:9092", topic="t", remap="s3://b/remap", group_id="shardsink-t",
                                   outputs={"a": "s3://b/a", "b": "s3://b/b"}, route_by="team", output="a")
    old = json.loads(OLD_ROUTED_KAFKA)["source"]
    assert health.read_sidecar(url) == {"remap": "s3://b/remap", "source": {k: v for k, v in old.items()
                                                                            if k not in ("offset_columns", "probe",
                                                                                         "chunk", "read_timeout_s")}}
    blob.put(health.SIDECAR_KEY, OLD_FILES)
    doc = health.read_sidecar_doc(url)
    assert doc is not None and doc.source == FilesSpec(root="s3://b/in", remap="s3://b/remap", settle_seconds=5.0,
                                                       schema={"arrow": "x"})
    # Rewritten from the typed document: the same reading.
    health.write_sidecar(url, doc.remap, doc.source)
    assert health.read_sidecar_doc(url) == doc


def test_a_sidecar_of_a_kind_registered_at_run_time_keeps_its_layout(tmp_path: Path) -> None:
    url = (tmp_path / "data").as_uri()
    spec = {"kind": "proc_kafka:GrowingKafka", "topic": "t", "remap": "s3://b/remap", "visible_file": "/n"}
    health.write_sidecar(url, "s3://b/remap", spec)
    got = open_blob(url).get(health.SIDECAR_KEY)
    assert got is not None and json.loads(got.data) == {"format": 1, "remap": "s3://b/remap", "source": spec}
    doc = health.read_sidecar_doc(url)
    assert doc is not None and isinstance(doc.source, CustomSpec) and doc.source.target == "proc_kafka:GrowingKafka"
    assert spec_to_builtins(doc.source) == spec
    assert health.read_sidecar(url) == {"remap": "s3://b/remap", "source": spec}


def test_a_sidecar_whose_spec_does_not_fit_its_kind_is_corruption_naming_the_object(tmp_path: Path) -> None:
    url = (tmp_path / "data").as_uri()
    open_blob(url).put(health.SIDECAR_KEY, OLD_ROUTED_KAFKA.replace(b'"chunk": 50000', b'"chunk": "lots"'))
    with pytest.raises(CorruptionError, match=r"reclock\.json: source spec of kind 'kafka'.*`\$\.chunk`"):
        health.read_sidecar_doc(url)
