"""Corrupted stores: unreadable state is reported precisely (CorruptionError naming the
object), never guessed around; the LATEST hint is only a cache and may be garbage.

Objects are tampered with behind the library's back: directly on disk for the local
folder, with a separate boto3 client against the moto endpoint for S3.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import CorruptionError, Shard
from shardsink.core import state_codec as sc
from shardsink.core.keys import LATEST, rollup_key, version_key
from shardsink.core.machine import ROLLUP_EVERY
from shardsink.storage import Blob, parse_url
from shardsink_dev.testing import FAKE_ENV, MotoServer

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


class Tamper:
    """Raw access to a shard's objects that bypasses shardsink entirely."""

    def __init__(self, write: Callable[[str, bytes], None], read: Callable[[str], bytes],
                 delete: Callable[[str], None]) -> None:
        self.write, self.read, self.delete = write, read, delete



@pytest.fixture(scope="module")
def raw_s3(moto: MotoServer) -> Any:
    """A plain boto3 client against the moto endpoint, independent of shardsink."""
    return boto3.client(
        "s3", endpoint_url=moto.endpoint, aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"], region_name=FAKE_ENV["AWS_DEFAULT_REGION"],
    )



@pytest.fixture
def tamper(shard_url: str, request: pytest.FixtureRequest) -> Tamper:
    u = parse_url(shard_url)
    if u.scheme == "file":
        root = Path(u.path)

        def write(key: str, data: bytes) -> None:
            (root / key).write_bytes(data)

        return Tamper(write, lambda key: (root / key).read_bytes(), lambda key: (root / key).unlink())
    s3 = request.getfixturevalue("raw_s3")

    def s3_write(key: str, data: bytes) -> None:
        s3.put_object(Bucket=u.bucket, Key=f"{u.path}/{key}", Body=data)

    def s3_read(key: str) -> bytes:
        return bytes(s3.get_object(Bucket=u.bucket, Key=f"{u.path}/{key}")["Body"].read())

    def s3_delete(key: str) -> None:
        s3.delete_object(Bucket=u.bucket, Key=f"{u.path}/{key}")

    return Tamper(s3_write, s3_read, s3_delete)


def table(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows], "_time": [r[2] for r in rows]})


@pytest.fixture
def shard(shard_url: str, blob: Blob) -> Shard:
    """Three versions: create (0), [0, 10) with a and b (1), [10, 20) with c (2)."""
    s = Shard.create(shard_url, SCHEMA, blob=blob)
    s.append(table([("a", 1, 0), ("b", 2, 5)]), lower=0, upper=10, desc_id="d1")
    s.append(table([("c", 3, 15)]), lower=10, upper=20, desc_id="d2")
    return s


def fresh(shard: Shard, blob: Blob) -> Shard:
    """A new handle with no cached versions (what a new process would see)."""
    return Shard(shard.url, blob=blob)


def snap(t: pa.Table) -> Counter[tuple[Any, Any]]:
    return Counter({(r["k"], r["v"]): r["_count"] for r in t.to_pylist()})


EXPECTED = Counter({("a", 1): 1, ("b", 2): 1, ("c", 3): 1})


# --- state versions ------------------------------------------------------------------------


def test_garbage_newest_state_version_makes_reads_raise_corruption_naming_the_key(
    shard: Shard, blob: Blob, tamper: Tamper
) -> None:
    key = version_key(2)
    tamper.write(key, b"\x00\x01 this is not json {")
    reader = fresh(shard, blob)
    for read in (reader.snapshot, lambda: reader.changes(0, 20), reader.log, reader.batches):
        with pytest.raises(CorruptionError, match=f"{shard.url}/{key}: unreadable state version"):
            read()


def test_state_version_claiming_another_seqno_is_corruption(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    tamper.write(version_key(2), tamper.read(version_key(1)))
    with pytest.raises(CorruptionError, match=f"{version_key(2)} claims seqno 1"):
        fresh(shard, blob).snapshot()


def test_missing_state_version_in_the_history_is_corruption(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    tamper.delete(version_key(1))
    with pytest.raises(CorruptionError, match=r"state versions \[1\] are missing from the history"):
        fresh(shard, blob).snapshot()


def test_garbage_latest_hint_is_ignored_and_everything_still_reads(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    tamper.write(LATEST, b"garbage")
    reader = fresh(shard, blob)
    info = reader.info()
    assert (info.seqno, info.upper) == (2, 20)
    assert snap(reader.snapshot()) == EXPECTED
    assert [s for s, _ in reader.log()] == [2, 1, 0]
    # the next commit still works and publishes a readable hint again
    reader.append(table([("d", 4, 20)]), lower=20, upper=30, desc_id="d3")
    hint = sc.decode_version(tamper.read(LATEST), where=LATEST)
    assert (hint.seqno, hint.header.upper) == (3, 30)
    assert snap(fresh(shard, blob).snapshot()) == EXPECTED + Counter({("d", 4): 1})


def test_missing_or_stale_latest_hint_is_tolerated(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    stale = tamper.read(version_key(0))
    tamper.write(LATEST, stale)
    assert fresh(shard, blob).info().seqno == 2
    assert snap(fresh(shard, blob).snapshot()) == EXPECTED
    tamper.delete(LATEST)
    assert fresh(shard, blob).info().seqno == 2
    assert snap(fresh(shard, blob).snapshot()) == EXPECTED


def test_hint_with_an_unknown_format_is_ignored(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    tamper.write(LATEST, b'{"format": 99}')
    assert fresh(shard, blob).info().seqno == 2


# --- parts -----------------------------------------------------------------------------------


def part_of(shard: Shard, desc_id: str) -> str:
    (batch,) = [b for b in shard.batches() if b.desc_id == desc_id]
    (part,) = batch.parts
    return part.key


def test_missing_part_raises_corruption_naming_the_part_key(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    key = part_of(shard, "d1")
    tamper.delete(key)
    reader = fresh(shard, blob)
    with pytest.raises(CorruptionError, match=f"part {shard.url}/{key} is missing"):
        reader.snapshot()
    with pytest.raises(CorruptionError, match=f"{key} is missing"):
        reader.changes(0, 10)
    # reads that do not need the part still work
    assert reader.changes(10, 20).num_rows == 1


def test_truncated_part_raises_corruption_naming_the_part_key(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    key = part_of(shard, "d1")
    data = tamper.read(key)
    tamper.write(key, data[: len(data) // 2])
    with pytest.raises(CorruptionError, match=f"part {shard.url}/{key} is unreadable"):
        fresh(shard, blob).snapshot()


def test_part_with_a_different_row_count_than_recorded_is_corruption(
    shard: Shard, blob: Blob, tamper: Tamper
) -> None:
    key = part_of(shard, "d1")
    one_row = pa.table({"k": ["a"], "v": [1], "_time": [0], "_diff": [1]})
    buf = io.BytesIO()
    pq.write_table(one_row, buf)
    tamper.write(key, buf.getvalue())
    with pytest.raises(CorruptionError, match=f"{key} has 1 rows; the state says 2"):
        fresh(shard, blob).snapshot()


def test_part_with_foreign_columns_is_corruption(shard: Shard, blob: Blob, tamper: Tamper) -> None:
    key = part_of(shard, "d1")
    other = pa.table({"x": [1.0, 2.0], "_time": [0, 1]})
    buf = io.BytesIO()
    pq.write_table(other, buf)
    tamper.write(key, buf.getvalue())
    with pytest.raises(CorruptionError, match=f"{key} does not match the shard schema"):
        fresh(shard, blob).snapshot()


# --- rollups ---------------------------------------------------------------------------------


def test_missing_or_garbage_rollup_is_corruption_naming_it(shard_url: str, blob: Blob, tamper: Tamper) -> None:
    s = Shard.create(shard_url, SCHEMA, blob=blob)
    for i in range(ROLLUP_EVERY):
        s.append(table([("a", i, i)]), lower=i, upper=i + 1, desc_id=f"d{i}")
    key = rollup_key(ROLLUP_EVERY)
    assert fresh(s, blob).info().rollup == ROLLUP_EVERY
    tamper.write(key, b"not json")
    with pytest.raises(CorruptionError, match=f"{s.url}/{key}: unreadable rollup"):
        fresh(s, blob).snapshot()
    tamper.delete(key)
    with pytest.raises(CorruptionError, match=f"rollup {ROLLUP_EVERY} referenced by version {ROLLUP_EVERY} is missing"):
        fresh(s, blob).snapshot()
