"""``shardsink gc --desc`` and ``shardsink drop``: deleting on an operator's word, only as far as it is safe.

``gc --desc`` goes through the fate primitive: what can never commit goes whatever its age, a
committed batch stays, a description that may still commit is refused (exit 2, nothing
deleted). ``drop`` deletes a whole shard and says what: refused without ``--yes``, for a URL
that holds no shard, and while the shard is in use; it closes the shard first, leaves
objects that are not the shard's, and a second run finishes an interrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.cli import main
from shardsink.core import leases as ls
from shardsink.errors import StorageError
from shardsink.sinks.description import Description
from shardsink.sinks.staging import write_manifest
from shardsink.storage.retry import RetryingBlob

SCHEMA = pa.schema([("k", pa.string())])


def _rows(i: int) -> pa.Table:
    return pa.table({"k": [f"k{i}", f"k{i}b"], "_time": [10 * i, 10 * i + 3]})


@pytest.fixture
def shard(shard_url: str) -> Shard:
    s = Shard.create(shard_url, SCHEMA)
    for i in range(3):
        s.append(_rows(i), lower=10 * i, upper=10 * (i + 1), desc_id=f"d{i}")
    return s  # upper 30


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    got = capsys.readouterr()
    return code, got.out, got.err


def _keys(shard: Shard, prefix: str = "") -> set[str]:
    return {o.key for o in shard._machine.blob.list(prefix)}


def test_gc_desc_deletes_a_dead_writers_objects_at_once_and_refuses_a_live_one(
        shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    dead = Description("dead-a1", 10, 20, 1)  # the upper (30) passed its lower: it can never commit
    staged = shard.stage(_rows(1), lower=10, upper=20, desc_id=dead.desc_id)
    write_manifest(shard, dead, slot=0, slots=1, parts=staged.parts)
    live = Description("live-a1", 30, 40, 1)  # at the upper: it may still commit
    kept = shard.stage(_rows(3), lower=30, upper=40, desc_id=live.desc_id)
    write_manifest(shard, live, slot=0, slots=1, parts=kept.parts)
    before = _keys(shard)

    code, out, _ = _cli(capsys, "gc", shard.url, "--desc", "dead-a1", "--dry-run")
    assert code == 0 and f"would delete {len(staged.parts)} parts" in out and _keys(shard) == before
    code, out, _ = _cli(capsys, "gc", shard.url, "--desc", "dead-a1", "--json")
    got = json.loads(out)
    assert code == 0 and (got["fate"], got["lower"], got["parts_deleted"], got["manifests_deleted"]) == (
        "cannot_commit", 10, len(staged.parts), 1)
    assert _keys(shard) == before - _keys_of(staged.parts) - {"staging/dead-a1/slot-0.json"}

    for extra in ((), ("--dry-run",)):
        code, _, err = _cli(capsys, "gc", shard.url, "--desc", "live-a1", *extra)
        assert code == 2 and "may still commit" in err and "shard upper 30, its lower 30" in err, err
    assert _keys(shard, "parts/live-a1/") == _keys_of(kept.parts) and _keys(shard, "staging/live-a1/")

    code, out, _ = _cli(capsys, "gc", shard.url, "--desc", "dead-a1")
    assert code == 0 and "nothing staged" in out  # again: idempotent
    with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2
        main(["gc", shard.url, "--desc", "../etc"])
    assert e.value.code == 2 and "description id '../etc' is invalid" in capsys.readouterr().err


def _keys_of(parts: object) -> set[str]:
    return {p.key for p in parts}  # type: ignore[attr-defined]


def test_gc_desc_keeps_the_committed_batch_of_a_description(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    """A retried slot left a second set of parts for d1, which committed the first: only the extra go."""
    extra = shard.stage(_rows(1), lower=10, upper=20, desc_id="d1")
    committed = {p.key for b in shard.batches() if b.desc_id == "d1" for p in b.parts}
    snapshot = shard.snapshot().sort_by("k")
    code, out, _ = _cli(capsys, "gc", shard.url, "--desc", "d1")
    assert code == 0 and f"deleted {len(extra.parts)} parts" in out and f"kept {len(committed)} parts" in out, out
    assert _keys(shard, "parts/d1/") == committed
    assert shard.snapshot().sort_by("k").equals(snapshot)
    assert main(["verify", shard.url]) == 0


def test_drop_needs_yes_and_says_what_it_would_delete(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    before = _keys(shard)
    code, out, err = _cli(capsys, "drop", shard.url)
    assert code == 2 and "without --yes; nothing was deleted" in err and "would delete" in out
    code, out, _ = _cli(capsys, "drop", shard.url, "--dry-run", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["objects_deleted"] == len(before) and _keys(shard) == before
    assert plan["deleted"]["version"] == 4 and plan["deleted"]["part"] == len(_keys(shard, "parts/"))
    code, _, err = _cli(capsys, "drop", shard.url, "--yes", "--dry-run")
    assert code == 2 and _keys(shard) == before


def test_drop_refuses_a_path_that_holds_no_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "data"
    (folder / "parts" / "x").mkdir(parents=True)
    (folder / "parts" / "x" / "y.parquet").write_bytes(b"not a shard's")
    (folder / "notes.txt").write_text("mine")
    code, _, err = _cli(capsys, "drop", folder.as_uri(), "--yes", "--force")
    assert code == 2 and "no shard at" in err
    assert (folder / "notes.txt").exists() and (folder / "parts" / "x" / "y.parquet").exists()


def test_drop_refuses_while_in_use_then_deletes_only_the_shards_objects(
        shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    lease = ls.acquire(shard, 25, holder="a long report")
    live = Description("live-a1", 30, 40, 1)
    write_manifest(shard, live, slot=0, slots=1, parts=shard.stage(_rows(3), lower=30, upper=40,
                                                                    desc_id=live.desc_id).parts)
    shard._machine.blob.put("notes.txt", b"an operator's file, not the shard's")
    before = _keys(shard)
    code, _, err = _cli(capsys, "drop", shard.url, "--yes")
    assert code == 2 and "a live read lease" in err and "a long report" in err and "live-a1 may still commit" in err
    assert _keys(shard) == before and shard.info().upper == 30, "refused: nothing written, not even the close"

    code, out, _ = _cli(capsys, "drop", shard.url, "--yes", "--force", "--json")
    done = json.loads(out)
    assert code == 0 and done["closed_at"] == 4 and done["upper"] == 30
    assert done["deleted"] == {"version": 5, "rollup": 0, "hint": 1, "part": len({k for k in before
                                                                                 if k.startswith("parts/")}),
                               "manifest": 1, "lease": 1, "root object": 0}
    assert done["left"] == ["notes.txt"] and done["late"] == [] and len(done["overridden"]) == 2
    assert _keys(shard) == {"notes.txt"}
    code, _, err = _cli(capsys, "drop", shard.url, "--yes")
    assert code == 2 and "no shard at" in err
    del lease


def test_a_writer_committing_while_drop_closes_makes_it_refuse(shard: Shard, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    close = Shard.close

    def racing_close(self: Shard, **kw: object) -> object:
        Shard.open(self.url).append(_rows(3), lower=30, upper=40, desc_id="racer")  # a writer got there first
        monkeypatch.setattr(Shard, "close", close)
        return close(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Shard, "close", racing_close)
    code, _, err = _cli(capsys, "drop", shard.url, "--yes")
    assert code == 2 and "a writer committed while it was being closed (upper 30 -> 40)" in err, err
    assert shard.info().upper == 40 and _keys(shard, "parts/racer/"), "nothing deleted, the shard still open"


def test_an_interrupted_drop_leaves_a_closed_shard_and_a_second_drop_finishes(
        shard: Shard, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = RetryingBlob.delete_many
    calls = []

    def crash_on_versions(self: RetryingBlob, keys: list[str]) -> None:
        calls.append(list(keys))
        if any(k.startswith("state/v/") for k in keys):
            raise StorageError("the store went away mid-drop")
        real(self, keys)

    monkeypatch.setattr(RetryingBlob, "delete_many", crash_on_versions)
    code, _, err = _cli(capsys, "drop", shard.url, "--yes")
    assert code == 1 and "went away" in err
    monkeypatch.setattr(RetryingBlob, "delete_many", real)
    assert not _keys(shard, "parts/") and Shard.open(shard.url).info().upper is None, "closed, data gone"
    code, out, _ = _cli(capsys, "drop", shard.url, "--yes", "--json")
    assert code == 0 and json.loads(out)["closed_at"] is None and json.loads(out)["deleted"]["version"] == 5
    assert _keys(shard) == set()
