"""Reclock's stored documents (bound inputs, health.json, reclock.json) are typed: the bytes
today's shardsink writes keep decoding, unknown fields are ignored, a newer format or
garbage is a CorruptionError naming the object. GC ages the bound inputs (caches) out and
verify knows all three; a bound input GC deleted is rebuilt from the remap shard.

The ``OLD_*`` bytes are exactly what shardsink wrote before these became structs (produced by
that code: ``json.dumps(..., sort_keys=True)``); health.json and reclock.json had no format.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.clock import Backdated

from shardsink import Shard
from shardsink.errors import CorruptionError
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.verify import verify
from shardsink.reclock import bound_input, health
from shardsink.reclock.bindings import FILES, BoundFile, Span
from shardsink.reclock.bound_input import BoundInput
from shardsink.reclock.layout import PLANS_PREFIX
from shardsink.reclock.remap import Proposal, RemapShard
from shardsink.storage.url import open_blob

OLD_PLAN = (b'{"files": [], "format": 1, "lower": 100, "spans": [["0", 0, 5, 109], ["1", 0, 2, 109]], '
            b'"upper": 110}')
OLD_FILES_PLAN = (b'{"files": [[0, "in/a.csv", 12], [1, "in/b.json", 30]], "format": 1, "lower": 100, '
                  b'"spans": [["files", 0, 2, 109]], "upper": 110}')
OLD_HEALTH = (b'{"at": "2026-11-23T06:58:37.143+00:00", "error": "StorageError: listing s3://x failed", '
              b'"status": "failing"}')
OLD_SIDECAR = (b'{"remap": "s3://bucket/remap", "source": {"kind": "kafka", "remap": "s3://bucket/remap", '
               b'"topic": "t"}}')


def _plus(data: bytes, **extra: Any) -> bytes:
    return json.dumps({**json.loads(data), **extra}).encode()


def _refusals(put: Any, read: Any, old: bytes, name: str, what: str) -> None:
    """A newer format and garbage are CorruptionErrors naming the object ``name``."""
    put(_plus(old, format=2))
    with pytest.raises(CorruptionError, match=rf"{name}: unsupported {what} format 2 .*upgrade"):
        read()
    for bad in (b"{not json", b"[1]", old.replace(b'"', b"'")):
        put(bad)
        with pytest.raises(CorruptionError, match=rf"{name}: unreadable {what}"):
            read()


def test_bound_inputs_written_before_typed_documents_still_load(tmp_path: Path) -> None:
    url = (tmp_path / "remap").as_uri()
    blob = open_blob(url)
    blob.put(bound_input.key(100, 110), OLD_PLAN)
    assert bound_input.load(url, 100, 110) == BoundInput(100, 110, (Span("0", 0, 5, 109), Span("1", 0, 2, 109)), {})
    blob.put(bound_input.key(100, 110), OLD_FILES_PLAN)
    files = {0: BoundFile(0, "in/a.csv", 12), 1: BoundFile(1, "in/b.json", 30)}
    assert bound_input.load(url, 100, 110) == BoundInput(100, 110, (Span(FILES, 0, 2, 109),), files)
    # What publish writes now: the same document, canonical, and it loads the same.
    remap = RemapShard.open_or_create(url, initial_upper=100)
    got = remap.bind_through(110, lambda _: Proposal({FILES: 2}, tuple(files.values())))
    published = bound_input.publish(url, got.bindings, 100, 110)
    now = blob.get(bound_input.key(100, 110))
    assert now is not None and json.loads(now.data) == json.loads(OLD_FILES_PLAN)
    assert bound_input.load(url, 100, 110) == published == BoundInput(100, 110, (Span(FILES, 0, 2, 109),), files)


def test_bound_inputs_ignore_unknown_fields_and_refuse_newer_formats_garbage_and_other_bounds(tmp_path: Path) -> None:
    url = (tmp_path / "remap").as_uri()
    blob = open_blob(url)
    k = bound_input.key(100, 110)
    blob.put(k, _plus(OLD_PLAN, added_by_a_newer_writer={"x": 1}))
    assert bound_input.load(url, 100, 110).spans[0] == Span("0", 0, 5, 109)
    _refusals(lambda d: blob.put(k, d), lambda: bound_input.load(url, 100, 110), OLD_PLAN, r"plans/100-110\.json",
              "bound input")
    blob.put(k, _plus(OLD_PLAN, lower=90))
    with pytest.raises(CorruptionError, match=r"plans/100-110\.json: bound input describes \[90, 110\)"):
        bound_input.load(url, 100, 110)


def test_health_and_sidecar_written_before_typed_documents_still_read(tmp_path: Path) -> None:
    url = (tmp_path / "remap").as_uri()
    blob = open_blob(url)
    blob.put(health.HEALTH_KEY, OLD_HEALTH)
    assert health.read(url) == {"status": "failing", "at": "2026-11-23T06:58:37.143+00:00",
                                "error": "StorageError: listing s3://x failed"}
    blob.put(health.SIDECAR_KEY, OLD_SIDECAR)
    spec = {"kind": "kafka", "remap": "s3://bucket/remap", "topic": "t"}
    assert health.read_sidecar(url) == {"remap": "s3://bucket/remap", "source": spec}
    # Written now: with a format, same readings.
    health.write_sidecar(url, "s3://bucket/remap", spec)
    got = blob.get(health.SIDECAR_KEY)
    assert got is not None and json.loads(got.data) == {**json.loads(OLD_SIDECAR), "format": 1}
    assert health.read_sidecar(url) == {"remap": "s3://bucket/remap", "source": spec}
    health.record_failure(url, "boom")
    assert health.read(url) == {"status": "failing", "at": health.read(url)["at"], "error": "boom"}  # type: ignore[index]


def test_health_and_sidecar_ignore_unknown_fields_and_refuse_newer_formats_and_garbage(tmp_path: Path) -> None:
    url = (tmp_path / "remap").as_uri()
    blob = open_blob(url)
    blob.put(health.HEALTH_KEY, _plus(OLD_HEALTH, format=1, retries=3))
    assert health.read(url)["status"] == "failing"  # type: ignore[index]
    blob.put(health.SIDECAR_KEY, _plus(OLD_SIDECAR, owner="team-a"))
    assert health.read_sidecar(url)["remap"] == "s3://bucket/remap"  # type: ignore[index]
    _refusals(lambda d: blob.put(health.HEALTH_KEY, d), lambda: health.read(url), OLD_HEALTH, r"health\.json",
              "source health")
    _refusals(lambda d: blob.put(health.SIDECAR_KEY, d), lambda: health.read_sidecar(url), OLD_SIDECAR,
              r"reclock\.json", "reclock sidecar")


def _readme_gc_keys() -> set[str]:
    """The keys README.md promises ``shardsink gc --json`` prints."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    m = re.search(r"`gc --json` prints `\{(.*?)\}`", text, re.S)
    assert m is not None, "README.md no longer states the gc --json contract"
    return set(re.findall(r'"(\w+)"', m.group(1)))



def test_gc_deletes_bound_inputs_past_the_grace_period_and_a_deleted_plan_is_rebuilt(shard_url: str) -> None:
    remap = RemapShard.open_or_create(shard_url, initial_upper=100)
    old = {}
    for lo, hi, f in ((100, 110, 3), (110, 120, 5)):
        got = remap.bind_through(hi, lambda _, f=f: Proposal({"0": f}))  # type: ignore[misc]
        old[(lo, hi)] = bound_input.publish(shard_url, got.bindings, lo, hi)
    health.record_failure(shard_url, "StorageError: listing s3://x failed")
    health.write_sidecar(shard_url, shard_url, {"kind": "kafka", "remap": shard_url, "topic": "t"})
    aged = Backdated(open_blob(shard_url))
    aged.backdate(3600)  # everything so far is an hour old; what follows is young
    got = remap.bind_through(130, lambda _: Proposal({"0": 9}))
    young = bound_input.publish(shard_url, got.bindings, 120, 130)
    shard = Shard.open(shard_url, blob=aged)
    blob = shard._machine.blob
    before = verify(shard)
    assert before.ok and not before.leaks, "plans, health.json and reclock.json are not leaks"

    def opts(dry: bool = False) -> GcOptions:
        return GcOptions(grace_s=1800, dry_run=dry)

    assert collect(shard, opts(dry=True)).plans_deleted == 2
    assert {o.key for o in blob.list(PLANS_PREFIX)} == {bound_input.key(lo, lo + 10) for lo in (100, 110, 120)}
    report = collect(shard, opts())
    assert report.plans_deleted == 2 and report.objects_deleted >= 2
    assert report.to_dict()["plans_deleted"] == 2 and set(report.to_dict()) == _readme_gc_keys()
    assert {o.key for o in blob.list(PLANS_PREFIX)} == {bound_input.key(120, 130)}, "young plan deleted or old kept"
    assert blob.get(health.HEALTH_KEY) is not None and blob.get(health.SIDECAR_KEY) is not None
    # The remap shard still works: deleted plans are rebuilt identical, the young one loads, binding goes on.
    for (lo, hi), p in old.items():
        assert bound_input.load(shard_url, lo, hi) == p
    assert bound_input.load(shard_url, 120, 130) == young
    fresh = RemapShard.open(shard_url)
    assert fresh.bind_through(140, lambda _: Proposal({"0": 12})).minted
    assert fresh.bindings().frontier_at(139) == {"0": 12}
    after = verify(Shard.open(shard_url))
    assert after.ok and not after.leaks
