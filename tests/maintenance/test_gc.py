"""GC deletes exactly what nothing can need, on both backends, and never anything else."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from gc_helpers import SCHEMA, append_days, compact_like, contents, keys, rows
from support.clock import Backdated

from shardsink import Shard
from shardsink.cli import main
from shardsink.core import fate as ft
from shardsink.core import leases as ls
from shardsink.core.keys import rollup_key, version_key
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.history import list_state
from shardsink.maintenance.verify import verify
from shardsink.storage.url import open_blob, parse_url

pytestmark = pytest.mark.usefixtures("small_windows")


def _manifest(shard: Shard, desc_id: str, lower: int, upper: int) -> str:
    key = f"staging/{desc_id}/slot-0.json"
    shard._machine.blob.put(key, json.dumps({"format": 1, "desc_id": desc_id, "lower": lower, "upper": upper}).encode())
    return key


def _versions(shard: Shard) -> list[int]:
    return sorted(list_state(shard.admin()).versions)



def test_gc_deletes_exactly_what_nothing_can_need(shard_url: str) -> None:
    aged = Backdated(open_blob(parse_url(shard_url)))
    shard = Shard.create(shard_url, SCHEMA, blob=aged)
    append_days(shard, 0, 20)                                   # versions 1..20, batches d0..d19
    compact_like(shard, ["d0", "d1", "d2", "d3"], "cmp1")       # version 21: d0..d3 compacted away
    append_days(shard, 20, 8)                                   # versions 22..29
    gone_parts = {p.key for b in Shard.open(shard_url)._machine.full_batches(shard._machine.fetch(20))  # type: ignore[arg-type]
                  for p in b.parts if b.desc_id in ("d0", "d1", "d2", "d3")}
    retried = shard.stage(rows(5), lower=50, upper=60, desc_id="d5").parts[0].key   # leftover of a retried write
    lost = shard.stage(rows(1), lower=10, upper=20, desc_id="lost")                  # lost race, with manifest
    lost_manifest = _manifest(shard, "lost", 10, 20)
    crashed = shard.stage(rows(3), lower=30, upper=40, desc_id="crashed")            # no manifest: lower from _time
    upper = 280
    future = shard.stage(pa.table({"k": ["f"], "_time": [upper]}), lower=upper, upper=upper + 10, desc_id="future")
    future_manifest = _manifest(shard, "future", upper, upper + 10)
    aged.backdate(3600)  # everything so far is an hour old; what follows is young
    young = shard.stage(rows(2), lower=20, upper=30, desc_id="young-lost")           # can never commit, but young
    young_manifest = _manifest(shard, "young-lost", 20, 30)
    before = contents(shard)
    head = shard.info().seqno
    all_parts = keys(shard, "parts/")

    def opts(dry: bool = False) -> GcOptions:
        return GcOptions(grace_s=1800, retention=20, dry_run=dry)

    dry = collect(shard, opts(dry=True))
    assert set(_versions(shard)) == set(range(head + 1)) and keys(shard, "parts/") == all_parts
    report = collect(shard, opts())
    assert (dry.versions_deleted, dry.rollups_deleted, dry.parts_deleted, dry.manifests_deleted) == (
        report.versions_deleted, report.rollups_deleted, report.parts_deleted, report.manifests_deleted)

    # Versions: the recent window (4 descriptions: versions 26..29) binds, moved back to the
    # rollup version 27 builds on (24) so that every retained version reads on its own chain.
    assert report.reason == "idempotency (rounded down to rollup 24)" and report.oldest_after == 24
    assert _versions(shard) == list(range(24, head + 1))
    assert shard._machine.fetch(24).header.rollup == 24  # type: ignore[union-attr]  # anchored
    assert {int(k[-25:-5]) for k in keys(shard, "state/rollup/")} == {24, 28}
    for s in range(24, head + 1):
        shard._machine.full_batches(shard._machine.fetch(s))  # type: ignore[arg-type]
    # Parts: compacted-away, retried-write leftover, lost and crashed descriptions; never the rest.
    deleted = all_parts - keys(shard, "parts/")
    assert deleted == gone_parts | {retried} | {p.key for p in lost.parts} | {p.key for p in crashed.parts}
    assert {p.key for p in future.parts} | {p.key for p in young.parts} <= keys(shard, "parts/")
    assert keys(shard, "staging/") == {future_manifest, young_manifest} and lost_manifest not in keys(shard, "staging/")
    assert report.still_possible == ("future",) and report.young_kept == 2
    assert report.parts_deleted == len(deleted)
    # Nothing referenced went: same contents, verify clean; a second run has nothing left to do.
    reopened = Shard.open(shard_url, blob=aged)
    assert contents(reopened) == before
    assert verify(reopened).ok
    again = collect(reopened, opts())
    assert again.objects_deleted == 0


def test_gc_never_deletes_lease_pinned_versions_or_young_objects(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 9)
    lease = ls.acquire(shard, 50, holder="reader", ttl_s=3600)
    pinned = shard._machine.fetch(lease.seqno)
    assert pinned is not None
    append_days(shard, 9, 15)
    head = shard.info().seqno
    # Young: a 1 h grace keeps every version (and everything else).
    assert collect(shard, GcOptions(grace_s=3600, retention=1)).objects_deleted == 0
    assert _versions(shard) == list(range(head + 1))
    # Old, but leased: the reader's version and the whole chain it reads from stay.
    report = collect(shard, GcOptions(grace_s=0, retention=1))
    assert report.reason.startswith(f"lease {lease.lease_id}") and report.oldest_after <= pinned.header.rollup
    assert min(_versions(shard)) == report.oldest_after <= pinned.header.rollup <= lease.seqno
    for s in range(lease.seqno, head + 1):
        v = shard._machine.fetch(s)
        assert v is not None
        shard._machine.full_batches(v)  # the reader's chain is whole
    ls.release(shard, lease)
    later = collect(shard, GcOptions(grace_s=0, retention=1))
    assert later.oldest_after > lease.seqno and later.reason.startswith(("idempotency", "head", "grace"))
    assert verify(Shard.open(shard_url)).ok


def test_commits_fate_and_log_keep_working_after_gc(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 30)
    d5 = shard.fate("d5", 50)
    assert isinstance(d5, ft.Committed)
    collect(shard, GcOptions(grace_s=0, retention=20))
    fresh = Shard.open(shard_url)
    oldest = min(_versions(fresh))
    assert oldest > 6  # d5's commit (version 6) is gone
    # A description committed before the horizon is still Committed, with its exact keys.
    again = fresh.fate("d5", 50)
    assert isinstance(again, ft.Committed) and again.keys == d5.keys
    # A retry of it is recognised, and a racing late description cannot commit.
    assert fresh.append(rows(5), lower=50, upper=60, desc_id="d5").status == "already_committed"
    assert isinstance(fresh.fate("late", 55), ft.CannotCommit)
    # New commits work, the log ends at the oldest retained version.
    append_days(fresh, 30, 3)
    assert fresh.info().upper == 330
    log = Shard.open(shard_url).log(limit=500)
    assert log[-1][0] == oldest and log[0][0] == fresh.info().seqno
    assert verify(Shard.open(shard_url)).ok


def test_gc_cli_dry_run_and_json(shard_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 3)
    lost = shard.stage(rows(0), lower=0, upper=10, desc_id="lost")
    assert main(["gc", shard_url, "--grace", "0", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True and out["parts_deleted"] == 1 and out["head"] == 3
    assert lost.parts[0].key in keys(shard, "parts/")
    assert main(["gc", shard_url, "--grace", "1h"]) == 0
    assert "deleted: 0 versions" in capsys.readouterr().out and lost.parts[0].key in keys(shard, "parts/")
    assert main(["gc", shard_url, "--grace", "0s"]) == 0
    assert lost.parts[0].key not in keys(shard, "parts/")
    with pytest.raises(SystemExit) as bad:
        main(["gc", shard_url, "--grace", "soon"])
    assert bad.value.code == 2


def test_key_helpers_name_the_objects_the_machine_writes(shard_url: str) -> None:
    """The key helpers GC relies on name the objects the machine writes."""
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 4)
    assert version_key(4) in keys(shard, "state/v/") and rollup_key(4) in keys(shard, "state/rollup/")


def test_retention_sets_how_much_history_is_kept(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 30)  # upper 300
    # No retention (the shard's own, unset): all history stays.
    keep_all = collect(shard, GcOptions(grace_s=0))
    assert (keep_all.reason, keep_all.versions_deleted, _versions(shard)[0]) == ("retention", 0, 0)
    # 50 ms: the first version whose upper is past 300 - 50 is 26 (upper 260); kept from the
    # rollup version 27 builds on (24).
    report = collect(shard, GcOptions(grace_s=0, retention=50))
    assert (report.reason, report.oldest_after) == ("retention (rounded down to rollup 24)", 24)
    assert _versions(shard) == list(range(24, 31))
    assert [s for s, _ in Shard.open(shard_url).log(limit=100)] == list(range(30, 23, -1))


def test_gc_leaves_pending_compaction_output_to_the_compaction_sweep(shard_url: str) -> None:
    """A compaction's fate depends on its inputs being live (the compaction module decides it);
    GC must not judge its staged output by upper alone, however old."""
    shard = Shard.create(shard_url, SCHEMA)
    append_days(shard, 0, 3)
    out = shard.stage(rows(0), lower=0, upper=10, desc_id="compact-abc")
    shard._machine.blob.put("staging/compact-abc/compaction.json", json.dumps(
        {"format": 1, "kind": "compaction", "compaction_id": "compact-abc", "since": 0,
         "inputs": [{"desc_id": "d0", "lower": 0, "upper": 10, "seqno": 1}]}).encode())
    report = collect(shard, GcOptions(grace_s=0))
    assert {p.key for p in out.parts} <= keys(shard, "parts/") and keys(shard, "staging/")
    assert any("compact-abc" in x for x in report.skipped)
