"""Reclocked sources never wedge and never ingest changed data (issue 17 items 9-12).

* 9: an executor-side read failure reaches the driver as its typed record (the write
  job's outcome says MalformedInputError, which fails the Airflow task at once), for
  file arrivals and Kafka;
* 10: every mint writes the outputs' pointer to their remap shard, so a crash after the
  binding or a second output shard never leaves one without it;
* 11: source keys are whatever the store allows (spaces, unicode, ``%``, ``+``, ``#``);
  a key no store can hold under the root is never bound and shows in the source's health;
* 12: a bound file rewritten in place with the same size is refused, not ingested; once
  its exact bytes are restored (a new mtime on a local folder), the write resumes (issue 32).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from rc_helpers import DAY, SCHEMA, START, assert_exactly_once, create_topic, mint_desc, run_once, write_slots

from shardsink import Shard
from shardsink.airflow.failures import for_airflow
from shardsink.errors import InvalidUsageError
from shardsink.outcome import error_from_record, record_of
from shardsink.reclock.health import read, read_sidecar
from shardsink.reclock.remap import RemapShard
from shardsink.sinks.append import append_from_manifests
from shardsink.sinks.description import Description
from shardsink.sources.files import FileArrivals
from shardsink.sources.kafka import KafkaSource
from shardsink.sources.landing import MalformedInputError, read_data_file
from shardsink.storage.url import open_blob
from shardsink_dev.testing import MotoServer

HOSTILE_KEYS = ["daily report 2024-01-01.jsonl", "été/cödé #1 +%20.csv", "a+b=c&d'e.parquet"]


def _urls(shard_url: str) -> tuple[str, str, str]:
    return f"{shard_url}/landing", f"{shard_url}/events", f"{shard_url}/remap"


def _jsonl(ids: range) -> bytes:
    return "".join(json.dumps({"id": i, "route": "a", "v": f"v{i}"}) + "\n" for i in ids).encode()


def land_raw(root: str, key: str, data: bytes, moto: MotoServer | None) -> None:
    """Write a source file as any uploader would, bypassing shardsink's shard-key rules."""
    if root.startswith("file://"):
        p = Path(root[len("file://"):]) / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return
    assert moto is not None
    from shardsink.storage.s3 import make_client

    bucket, _, prefix = root[len("s3://"):].partition("/")
    make_client().put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)


def _moto(request: pytest.FixtureRequest, backend: str) -> MotoServer | None:
    return request.getfixturevalue("moto") if backend == "s3" else None


def _read_error(spark: Any, src: Any, d: Description, shard_url: str) -> Any:
    """Run the slot read as the write job does; return the record its outcome would carry."""
    shard = Shard.open(shard_url)
    df, _ = src.read_slot(spark, lower=d.lower, upper=d.upper, slot=0, slots=1, schema=shard.schema)
    with pytest.raises(Exception) as e:
        df.collect()
    return record_of(e.value)


def test_file_names_are_whatever_the_store_allows(spark: Any, shard_url: str, backend: str,
                                                  request: pytest.FixtureRequest) -> None:
    root, data, remap = _urls(shard_url)
    moto = _moto(request, backend)
    ids: list[int] = []
    for n, key in enumerate(HOSTILE_KEYS):
        chunk = range(10 * n, 10 * n + 10)
        if key.endswith(".csv"):
            body = ("id,route,v\n" + "".join(f"{i},a,v{i}\n" for i in chunk)).encode()
        elif key.endswith(".parquet"):
            import io

            import pyarrow as pa
            import pyarrow.parquet as pq

            buf = io.BytesIO()
            pq.write_table(pa.table({"id": list(chunk), "route": ["a"] * 10, "v": [f"v{i}" for i in chunk]}), buf)
            body = buf.getvalue()
        else:
            body = _jsonl(chunk)
        land_raw(root, key, body, moto)
        ids += list(chunk)
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    run_once(spark, data, src, interval_end=START + DAY)
    assert_exactly_once(data, ids)
    assert sorted(f.key for f in RemapShard.open(remap).bindings().files().values()) == sorted(HOSTILE_KEYS)


def test_a_key_no_store_can_hold_is_never_bound_and_shows_in_health(spark: Any, tmp_path: Path) -> None:
    root, data, remap = (tmp_path / "landing").as_uri(), (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    deep = "/".join(["d" * 250] * 5) + "/x.jsonl"  # a local path S3 could not hold (> 1,024 bytes)
    land_raw(root, deep, _jsonl(range(0, 5)), None)
    land_raw(root, "ok.jsonl", _jsonl(range(5, 10)), None)
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    run_once(spark, data, src, interval_end=START + DAY)
    assert_exactly_once(data, range(5, 10))  # the source keeps going
    assert [f.key for f in RemapShard.open(remap).bindings().files().values()] == ["ok.jsonl"]
    h = read(remap)
    assert h is not None and "never bound" in h["error"] and "1024" in h["error"]


@pytest.mark.parametrize("change", ["resized", "same-size rewrite", "vanished"])
def test_a_bound_file_that_changed_fails_the_write_and_restoring_its_bytes_resumes_it(
        spark: Any, shard_url: str, backend: str, request: pytest.FixtureRequest, change: str) -> None:
    root, data, remap = _urls(shard_url)
    moto = _moto(request, backend)
    original = _jsonl(range(0, 10))
    land_raw(root, "in/a.jsonl", original, moto)
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    d = mint_desc(data, src, interval_end=START + DAY)  # binds the file with its size and identity
    assert isinstance(d, Description)
    assert RemapShard.open(remap).bindings().files()[0].identity, "bound without an identity"
    if change == "resized":
        land_raw(root, "in/a.jsonl", _jsonl(range(0, 11)), moto)
    elif change == "same-size rewrite":  # even within one mtime tick: the identity is the content's
        land_raw(root, "in/a.jsonl", original.replace(b'"v1"', b'"x1"'), moto)
    elif backend == "local":
        (Path(root[len("file://"):]) / "in/a.jsonl").unlink()
    else:
        from shardsink.storage.s3 import make_client

        bucket, _, prefix = root[len("s3://"):].partition("/")
        make_client().delete_object(Bucket=bucket, Key=f"{prefix}/in/a.jsonl")
    rec = _read_error(spark, src, d, data)
    assert (rec.error_class, rec.raised) == ("InvalidUsageError", "MalformedInputError"), rec
    assert "in/a.jsonl" in rec.message and ("bound" in rec.message or "disappeared" in rec.message), rec.message
    assert isinstance(for_airflow(error_from_record(rec)), AirflowFailException)  # fails at once: one spark-submit

    if change != "same-size rewrite":  # every change ends the same way once restored: check one
        return
    # The runbook's fix: restore the exact original bytes. The restored copy is a new upload
    # (on a local folder a new mtime, pushed 1 s on so no timestamp tick can hide it).
    land_raw(root, "in/a.jsonl", original, moto)
    if backend == "local":
        p = Path(root[len("file://"):]) / "in/a.jsonl"
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    shard = Shard.open(data)
    write_slots(spark, shard, src, d, slots=1)  # the write task's retry, same description
    append_from_manifests(shard, d, 1)
    assert_exactly_once(data, range(0, 10))


def test_an_mtime_identity_keeps_its_check_and_a_content_identity_ignores_mtimes(tmp_path: Path) -> None:
    """Local bindings recorded before content identities (``<mtime ns hex>-<size hex>``) are
    checked against the mtime and size: restored bytes under a new mtime are refused until the
    mtime is restored too. A content identity sees a same-size rewrite under the same mtime."""
    root = tmp_path / "landing"
    original = _jsonl(range(0, 10))
    land_raw(root.as_uri(), "a.jsonl", original, None)
    p, blob = root / "a.jsonl", open_blob(root.as_uri())
    bound_ns = p.stat().st_mtime_ns
    kw: dict[str, Any] = {"where": "a.jsonl", "size": len(original)}
    old = f"{bound_ns:x}-{len(original):x}"
    assert read_data_file(blob, "a.jsonl", SCHEMA, identity=old, **kw).num_rows == 10
    p.write_bytes(original)  # the exact bytes restored: a new mtime
    os.utime(p, ns=(bound_ns, bound_ns + 1_000_000_000))
    with pytest.raises(MalformedInputError, match="rewritten after it was bound"):
        read_data_file(blob, "a.jsonl", SCHEMA, identity=old, **kw)
    os.utime(p, ns=(bound_ns, bound_ns))  # and the mtime, the identity's first field
    assert read_data_file(blob, "a.jsonl", SCHEMA, identity=old, **kw).num_rows == 10

    got = blob.get_source("a.jsonl")
    assert got is not None and got.identity.startswith("sha256:")
    p.write_bytes(original.replace(b'"v1"', b'"x1"'))  # same size, mtime put back
    os.utime(p, ns=(bound_ns, bound_ns))
    with pytest.raises(MalformedInputError, match="rewritten after it was bound"):
        read_data_file(blob, "a.jsonl", SCHEMA, identity=got.identity, **kw)


def test_a_kafka_range_that_cannot_be_read_fails_with_a_typed_record(spark: Any, kafka: str, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    topic = create_topic(kafka, 1)
    p = KafkaProducer(bootstrap_servers=kafka)
    try:
        p.send(topic, b"not json", partition=0).get(timeout=30)
    finally:
        p.close()
    data, remap = (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    src = KafkaSource(kafka, topic, remap=remap, schema=SCHEMA)
    d = mint_desc(data, src, interval_end=START + DAY)
    assert isinstance(d, Description)
    rec = _read_error(spark, src, d, data)
    assert (rec.error_class, rec.raised) == ("InvalidUsageError", "MalformedInputError"), rec
    assert "not a JSON object" in rec.message, rec
    assert isinstance(for_airflow(error_from_record(rec)), AirflowFailException)


def test_every_mint_points_each_output_at_its_remap_shard(shard_url: str, backend: str,
                                                          request: pytest.FixtureRequest) -> None:
    """A mint that died after its binding (the pointer gone) and a second output shard
    minted from an existing remap shard both get reclock.json from the next mint."""
    root, data, remap = _urls(shard_url)
    land_raw(root, "a.jsonl", _jsonl(range(0, 5)), _moto(request, backend))
    src = FileArrivals(root, remap=remap, settle_seconds=0, schema=SCHEMA)
    d = mint_desc(data, src, interval_end=START + DAY)
    assert isinstance(d, Description)
    Shard.open(data)._machine.blob.delete("reclock.json")  # as if the first mint died before writing it
    assert read_sidecar(data) is None
    mint_desc(data, src, interval_end=START + DAY)  # the retried mint (same interval)
    assert read_sidecar(data) == {"remap": RemapShard.open(remap).url, "source": src.spec()}
    other = f"{shard_url}/events-2"
    mint_desc(other, src, interval_end=START + DAY)
    assert read_sidecar(other) == {"remap": RemapShard.open(remap).url, "source": src.spec()}


def test_source_keys_skip_the_shard_key_check_but_not_the_stores_limits(tmp_path: Path) -> None:
    from shardsink.storage.base import check_source_key

    for ok in HOSTILE_KEYS:
        assert check_source_key(ok) == ok
    for bad in ["", "/abs", "a/../b", "a//b", "./a", "a\0b", "x" * 1025]:
        with pytest.raises(InvalidUsageError):
            check_source_key(bad)
