"""A GC killed at any step leaves a readable shard that verifies; the next GC finishes the job.

The GC runs in a child OS process that kills itself (``os._exit``) right after the named
step (through the injected ``after_step`` hook); a second test makes S3 fail the
deletion of one version with persistent 500s through the fault proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from gc_helpers import SCHEMA, append_days, compact_like, contents, rows

from shardsink import Shard, ShardsinkError
from shardsink.core.keys import version_key
from shardsink.core.machine import Machine
from shardsink.errors import StorageError
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.history import list_state
from shardsink.maintenance.verify import verify
from shardsink.storage.base import Blob
from shardsink.storage.retry import COMMIT, STORAGE
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev.testing import MotoServer

pytestmark = pytest.mark.usefixtures("small_windows")

CHILD = textwrap.dedent("""
    import os, sys
    from shardsink import Shard
    from shardsink.maintenance.gc import collect
    from shardsink.maintenance.gc_types import GcOptions
    url, step, nth, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    seen = {}
    def hook(s):
        seen[s] = seen.get(s, 0) + 1
        if s == step and seen[s] == nth:
            os._exit(17)
    collect(Shard.open(url), GcOptions(grace_s=0, retention=20, after_step=hook, delete_batch=batch))
    sys.exit(3)  # the step was never reached
""")
#: (step, occurrence): after anchoring, after the first / tenth chunk of versions (one version
#: a chunk: ``delete_batch=1``, except "version"/1, one multi-object delete of all of them),
#: after all versions, after rollups, after the first description's parts, after all parts.
KILL_POINTS = [("anchored", 1), ("version", 1), ("version", 10), ("versions", 1), ("rollups", 1), ("desc", 1),
               ("parts", 1)]
#: Every point on the local folder; the mid-phase ones on S3 too (each S3 case costs ~10 s).
CASES = [("local", s, n) for s, n in KILL_POINTS] + [("s3", "version", 10), ("s3", "rollups", 1), ("s3", "desc", 1)]


def _history(url: str) -> Shard:
    shard = Shard.create(url, SCHEMA)
    append_days(shard, 0, 20)
    compact_like(shard, ["d0", "d1", "d2", "d3"], "cmp1")
    append_days(shard, 20, 8)
    shard.stage(rows(1), lower=10, upper=20, desc_id="lost")
    shard.stage(rows(3), lower=30, upper=40, desc_id="crashed")
    return shard


def _assert_whole(url: str, before: list[tuple[str, int]]) -> None:
    fresh = Shard.open(url)
    report = verify(fresh)
    assert report.ok, report.problems
    assert contents(fresh) == before


@pytest.mark.parametrize(("backend", "step", "nth"), CASES, ids=[f"{b}-{s}-{n}" for b, s, n in CASES])
def test_gc_killed_after_any_step_leaves_a_verifiable_shard_and_the_next_run_finishes(
        shard_url: str, step: str, nth: int) -> None:
    shard = _history(shard_url)
    before = contents(shard)
    batch = 1000 if (step, nth) == ("version", 1) else 1
    r = subprocess.run([sys.executable, "-c", CHILD, shard_url, step, str(nth), str(batch)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 17, r.stderr[-3000:]
    _assert_whole(shard_url, before)
    # The shard stays writable in between, and the next run completes the collection.
    append_days(Shard.open(shard_url), 28, 1)
    before = contents(Shard.open(shard_url))
    final = collect(Shard.open(shard_url), GcOptions(grace_s=0, retention=20))
    _assert_whole(shard_url, before)
    done = verify(Shard.open(shard_url))
    assert [x.object for x in done.leaks] == []  # nothing left over
    assert min(list_state(Shard.open(shard_url).admin()).versions) == final.oldest_after == 24


@pytest.fixture
def proxied(moto: MotoServer) -> Iterator[tuple[str, object]]:
    from support.faultproxy import fault_proxy

    with fault_proxy(moto.endpoint) as proxy:
        yield f"s3://shardsink-test/gc-faults-{uuid.uuid4().hex[:10]}", proxy


def test_gc_failing_on_s3_mid_deletion_leaves_a_verifiable_shard(proxied: tuple[str, object],
                                                                  moto: MotoServer) -> None:
    url, proxy = proxied
    prefix = url.split("/", 3)[3]
    _history(url)
    before = contents(Shard.open(url))
    faulty = S3Blob("shardsink-test", prefix, client=make_client(endpoint_url=proxy.url))  # type: ignore[attr-defined]
    sleeps: list[float] = []
    machine = Machine(faulty, storage_policy=STORAGE.with_sleep(sleeps.append),
                      commit_policy=COMMIT.with_sleep(sleeps.append))
    proxy.add("status_before_forward", method="DELETE", key=version_key(7).replace(".", r"\."),  # type: ignore[attr-defined]
              status=500, times=None)
    with pytest.raises(ShardsinkError):  # 500 on a DELETE: the outcome is unknown
        collect(Shard(url, machine=machine), GcOptions(grace_s=0, retention=20, delete_batch=1))
    assert min(list_state(Shard.open(url).admin()).versions) == 7  # 0..6 deleted, then the 500s
    _assert_whole(url, before)
    proxy.clear_rules()  # type: ignore[attr-defined]
    collect(Shard.open(url), GcOptions(grace_s=0, retention=20))
    _assert_whole(url, before)
    assert verify(Shard.open(url)).leaks == ()
    assert os.environ.get("AWS_ENDPOINT_URL") == moto.endpoint


class _HalfDeletes:
    """A store whose first multi-object delete removes every other key (S3 promises no
    order inside one request) and then fails, as a request cut short would."""

    def __init__(self, inner: Blob) -> None:
        self.inner, self.url, self.cut = inner, inner.url, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def delete_many(self, keys: Sequence[str]) -> None:
        if not self.cut:
            self.cut = True
            self.inner.delete_many(list(keys)[1::2])
            raise StorageError(f"DELETE {len(keys)} objects on {self.url}: connection reset", retryable=False)
        self.inner.delete_many(keys)


@pytest.mark.parametrize("backend", ["local", "s3"], indirect=True)
def test_a_multi_object_delete_cut_short_leaves_stragglers_that_verify_lists_and_the_next_gc_deletes(
        shard_url: str) -> None:
    _history(shard_url)
    before = contents(Shard.open(shard_url))
    shard = Shard.open(shard_url)
    cut = Machine(_HalfDeletes(shard._machine.raw), storage_policy=STORAGE.with_sleep(lambda _s: None))
    with pytest.raises(ShardsinkError):
        collect(Shard(shard_url, machine=cut), GcOptions(grace_s=0, retention=20))
    listed = sorted(list_state(Shard.open(shard_url).admin()).versions)
    assert listed[0] == 0 and 1 not in listed and 24 in listed, "versions 1, 3, ... gone, 0, 2, ... left"
    report = verify(Shard.open(shard_url))
    assert report.ok, report.problems
    assert report.oldest == 24
    assert {x.object for x in report.leaks if x.kind == "version"} == {version_key(s) for s in listed if s < 24}
    assert contents(Shard.open(shard_url)) == before
    # Appends and fates still work on the chain from the anchor; the next GC removes the stragglers.
    append_days(Shard.open(shard_url), 28, 1)
    before = contents(Shard.open(shard_url))
    final = collect(Shard.open(shard_url), GcOptions(grace_s=0, retention=20))
    assert final.versions_deleted >= len([s for s in listed if s < 24])
    _assert_whole(shard_url, before)
    assert verify(Shard.open(shard_url)).leaks == ()
    assert min(list_state(Shard.open(shard_url).admin()).versions) == 24


def test_a_500_on_the_multi_object_delete_of_versions_leaves_a_verifiable_shard(
        proxied: tuple[str, object]) -> None:
    url, proxy = proxied
    prefix = url.split("/", 3)[3]
    _history(url)
    before = contents(Shard.open(url))
    faulty = S3Blob("shardsink-test", prefix, client=make_client(endpoint_url=proxy.url))  # type: ignore[attr-defined]
    machine = Machine(faulty, storage_policy=STORAGE.with_sleep(lambda _s: None))
    proxy.add("status_before_forward", method="POST", key=r"\?delete", status=500, times=None)  # type: ignore[attr-defined]
    with pytest.raises(ShardsinkError):
        collect(Shard(url, machine=machine), GcOptions(grace_s=0, retention=20))
    posts = proxy.requests("POST")  # type: ignore[attr-defined]
    assert posts and all(q.fault == "status_before_forward" for q in posts), "versions go in one request"
    _assert_whole(url, before)
    proxy.clear_rules()  # type: ignore[attr-defined]
    collect(Shard.open(url), GcOptions(grace_s=0, retention=20))
    _assert_whole(url, before)
    assert verify(Shard.open(url)).leaks == ()
