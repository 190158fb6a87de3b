"""One contract suite for every Blob backend (local folder, S3 over a real moto server),
and the shard URL rules that pick a backend."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardsink.errors import ConditionFailedError, InvalidUsageError
from shardsink.storage import Blob, ShardUrl, open_blob, parse_url
from shardsink.storage.local import LocalBlob
from shardsink.storage.retry import RetryingBlob
from shardsink.storage.s3 import S3Blob

BUCKET = "shardsink-test"  # created by the session `moto` fixture in tests/conftest.py



@pytest.fixture
def make_blob(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], Blob]:
    """Blobs rooted at ``name`` on the parametrised backend (fresh namespace per test)."""
    ns = uuid.uuid4().hex[:8]
    if backend == "s3":
        client = request.getfixturevalue("s3_client")
        return lambda name: S3Blob(BUCKET, f"{ns}/{name}", client=client)
    return lambda name: LocalBlob(tmp_path / ns / name)


@pytest.fixture
def blob(make_blob: Callable[[str], Blob]) -> Blob:
    return make_blob("shard")


def keys(blob: Blob, prefix: str = "") -> list[str]:
    return sorted(o.key for o in blob.list(prefix))


# --- get / put ------------------------------------------------------------------------


def test_get_of_missing_key_returns_none(blob: Blob) -> None:
    assert blob.get("state/v/00000000000000000000.json") is None
    assert blob.get("nothing") is None


def test_put_then_get_returns_the_same_bytes_and_etag(blob: Blob) -> None:
    data = bytes(range(256)) * 4
    etag = blob.put("parts/d1/a.parquet", data)
    got = blob.get("parts/d1/a.parquet")
    assert got is not None
    assert got.data == data
    assert got.etag == etag


def test_put_overwrites_and_changes_the_etag(blob: Blob) -> None:
    e1 = blob.put("k", b"one")
    e2 = blob.put("k", b"two")
    got = blob.get("k")
    assert got is not None and got.data == b"two" and got.etag == e2 != e1


def test_empty_object_round_trips(blob: Blob) -> None:
    blob.put("empty", b"")
    got = blob.get("empty")
    assert got is not None and got.data == b""


# --- create (If-None-Match: *) ----------------------------------------------------------------


def test_create_is_exclusive_and_second_create_leaves_the_first_object(blob: Blob) -> None:
    etag = blob.create("state/v/00000000000000000001.json", b"first")
    with pytest.raises(ConditionFailedError):
        blob.create("state/v/00000000000000000001.json", b"second")
    got = blob.get("state/v/00000000000000000001.json")
    assert got is not None and got.data == b"first" and got.etag == etag


def test_create_over_a_plain_put_object_fails(blob: Blob) -> None:
    blob.put("k", b"plain")
    with pytest.raises(ConditionFailedError):
        blob.create("k", b"created")
    got = blob.get("k")
    assert got is not None and got.data == b"plain"


def test_concurrent_creates_have_exactly_one_winner(blob: Blob) -> None:
    def attempt(i: int) -> bool:
        try:
            blob.create("race", f"writer-{i}".encode())
            return True
        except ConditionFailedError:
            return False

    with ThreadPoolExecutor(max_workers=8) as pool:
        wins = list(pool.map(attempt, range(8)))
    assert wins.count(True) == 1
    got = blob.get("race")
    assert got is not None and got.data == f"writer-{wins.index(True)}".encode()


# --- replace (If-Match) ---------------------------------------------------------------------


def test_replace_with_current_etag_succeeds_and_returns_the_new_etag(blob: Blob) -> None:
    e1 = blob.put("state/LATEST.json", b"v1")
    e2 = blob.replace("state/LATEST.json", b"v2", etag=e1)
    got = blob.get("state/LATEST.json")
    assert got is not None and got.data == b"v2" and got.etag == e2 != e1


def test_replace_with_stale_etag_fails_and_leaves_the_object(blob: Blob) -> None:
    e1 = blob.put("state/LATEST.json", b"v1")
    e2 = blob.replace("state/LATEST.json", b"v2", etag=e1)
    with pytest.raises(ConditionFailedError):
        blob.replace("state/LATEST.json", b"stale", etag=e1)
    got = blob.get("state/LATEST.json")
    assert got is not None and got.data == b"v2" and got.etag == e2


def test_replace_with_no_etag_on_existing_object_fails(blob: Blob) -> None:
    blob.put("state/LATEST.json", b"v1")
    with pytest.raises(ConditionFailedError):
        blob.replace("state/LATEST.json", b"v2", etag=None)
    got = blob.get("state/LATEST.json")
    assert got is not None and got.data == b"v1"


def test_replace_with_no_etag_on_missing_object_creates_it(blob: Blob) -> None:
    etag = blob.replace("state/LATEST.json", b"v1", etag=None)
    got = blob.get("state/LATEST.json")
    assert got is not None and got.data == b"v1" and got.etag == etag


def test_replace_of_missing_object_with_an_etag_fails(blob: Blob) -> None:
    etag = blob.put("other", b"x")
    with pytest.raises(ConditionFailedError):
        blob.replace("state/LATEST.json", b"v1", etag=etag)
    assert blob.get("state/LATEST.json") is None


# --- list / delete -------------------------------------------------------------------------


def test_list_returns_relative_keys_and_sizes_under_the_prefix_only(blob: Blob) -> None:
    blob.put("parts/a/1.parquet", b"12345")
    blob.put("parts/a/2.parquet", b"1")
    blob.put("parts/ab/3.parquet", b"12")
    blob.create("state/v/00000000000000000000.json", b"{}")
    assert keys(blob, "parts/a/") == ["parts/a/1.parquet", "parts/a/2.parquet"]
    assert keys(blob, "parts/") == ["parts/a/1.parquet", "parts/a/2.parquet", "parts/ab/3.parquet"]
    assert keys(blob, "state/v/") == ["state/v/00000000000000000000.json"]
    assert keys(blob) == [
        "parts/a/1.parquet", "parts/a/2.parquet", "parts/ab/3.parquet", "state/v/00000000000000000000.json",
    ]
    sizes = {o.key: o.size for o in blob.list("parts/")}
    assert sizes == {"parts/a/1.parquet": 5, "parts/a/2.parquet": 1, "parts/ab/3.parquet": 2}
    assert all(o.modified > 0 for o in blob.list(""))


def test_list_of_missing_prefix_is_empty(blob: Blob) -> None:
    assert keys(blob, "parts/") == []
    blob.put("state/LATEST.json", b"x")
    assert keys(blob, "parts/") == []


def test_list_never_shows_a_sibling_roots_objects(make_blob: Callable[[str], Blob]) -> None:
    a, ab = make_blob("shard"), make_blob("shard2")
    a.put("k", b"a")
    ab.put("k", b"ab")
    assert keys(a) == ["k"] and keys(ab) == ["k"]
    got = a.get("k")
    assert got is not None and got.data == b"a"


def test_delete_removes_the_object_and_is_idempotent(blob: Blob) -> None:
    blob.put("parts/d/x.parquet", b"x")
    blob.put("parts/d/y.parquet", b"y")
    blob.delete("parts/d/x.parquet")
    assert blob.get("parts/d/x.parquet") is None
    blob.delete("parts/d/x.parquet")
    blob.delete("never/existed")
    assert keys(blob, "parts/") == ["parts/d/y.parquet"]


# --- key validation -----------------------------------------------------------------------

BAD_KEYS = ["../escape", "parts/../../x", "a//b", "/abs", "trailing/", "", ".", "a/./b", "..", "sp ace", "a\\b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_with_dotdot_or_empty_segments_are_refused_by_every_operation(blob: Blob, key: str) -> None:
    ops: list[Callable[[], object]] = [
        lambda: blob.get(key),
        lambda: blob.put(key, b"x"),
        lambda: blob.create(key, b"x"),
        lambda: blob.replace(key, b"x", etag=None),
        lambda: blob.delete(key),
    ]
    for op in ops:
        with pytest.raises(InvalidUsageError, match="invalid object key"):
            op()
    assert keys(blob) == []


@pytest.mark.parametrize("prefix", ["../", "../other/", "a/../"])
def test_list_with_dotdot_prefix_is_refused(blob: Blob, prefix: str) -> None:
    with pytest.raises(InvalidUsageError, match="invalid object key"):
        list(blob.list(prefix))


# --- shard URLs ----------------------------------------------------------------------------


def test_parse_url_file_absolute() -> None:
    assert parse_url("file:///data/events") == ShardUrl("file", "", "/data/events")
    assert parse_url("file:///data/events/") == ShardUrl("file", "", "/data/events")
    assert parse_url("file://localhost/data/events") == ShardUrl("file", "", "/data/events")
    assert str(parse_url("file:///data/events")) == "file:///data/events"


def test_parse_url_relative_and_bare_paths_become_absolute_file_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_url("events") == ShardUrl("file", "", str(tmp_path / "events"))
    assert parse_url("data/events") == ShardUrl("file", "", str(tmp_path / "data" / "events"))
    assert parse_url("/abs/events") == ShardUrl("file", "", "/abs/events")
    assert parse_url("./events") == ShardUrl("file", "", str(tmp_path / "events"))


def test_parse_url_s3_bucket_and_prefix() -> None:
    assert parse_url("s3://my-bucket/team/events") == ShardUrl("s3", "my-bucket", "team/events")
    assert parse_url("s3://my-bucket/events/") == ShardUrl("s3", "my-bucket", "events")
    assert str(parse_url("s3://my-bucket/team/events")) == "s3://my-bucket/team/events"


@pytest.mark.parametrize(
    "url",
    ["../x", "a/../b", "a/..", "file:///data/../etc", "file:///data/x/..", "s3://bucket/../x", "s3://bucket/a/../b"],
)
def test_parse_url_refuses_dotdot_anywhere(url: str) -> None:
    with pytest.raises(InvalidUsageError, match=r"'\.\.'"):
        parse_url(url)


@pytest.mark.parametrize("url", ["s3://ab/x", "s3://Bad_Bucket/x", "s3://-bucket/x", "s3:///x"])
def test_parse_url_refuses_bad_bucket_names_naming_the_bucket(url: str) -> None:
    with pytest.raises(InvalidUsageError, match="not a valid S3 bucket name"):
        parse_url(url)


@pytest.mark.parametrize("url", ["s3://my-bucket", "s3://my-bucket/", "s3://my-bucket//"])
def test_parse_url_refuses_s3_url_without_a_prefix(url: str) -> None:
    with pytest.raises(InvalidUsageError, match="needs a prefix"):
        parse_url(url)


def test_parse_url_refuses_empty_s3_segment() -> None:
    with pytest.raises(InvalidUsageError, match="empty path segment"):
        parse_url("s3://my-bucket/a//b")


@pytest.mark.parametrize("url", ["gs://bucket/x", "http://host/x", "hdfs://nn/x"])
def test_parse_url_refuses_unknown_schemes_naming_the_scheme(url: str) -> None:
    scheme = url.split(":")[0]
    with pytest.raises(InvalidUsageError, match=f"scheme '{scheme}'"):
        parse_url(url)


@pytest.mark.parametrize("url", ["", "file://host/data", "file:///"])
def test_parse_url_refuses_empty_urls_and_file_urls_without_local_absolute_path(url: str) -> None:
    with pytest.raises(InvalidUsageError):
        parse_url(url)


def test_open_blob_picks_the_backend_from_the_url(tmp_path: Path, moto: object) -> None:
    local = open_blob(f"file://{tmp_path}/s")  # every store from open_blob carries the retry wrapper
    assert isinstance(local, RetryingBlob) and isinstance(local.inner, LocalBlob)
    assert local.url == local.inner.url == f"file://{tmp_path}/s"
    wrapped = open_blob(f"s3://{BUCKET}/team/s")
    s3 = wrapped.inner
    assert isinstance(s3, S3Blob) and (s3.bucket, s3.prefix, s3.url) == (BUCKET, "team/s", f"s3://{BUCKET}/team/s")
    assert wrapped.url == s3.url
