"""core/admin.py: the maintenance handle refuses every key outside the shard layout, deletes
staged data only through the fate's one deleter (which re-checks the fate), and commits
only maintenance commands."""

from __future__ import annotations

import pytest
from support import SCHEMA, rows_for, table_of

import shardsink.reclock.layout  # noqa: F401  (registers reclock's root objects, e.g. plans/)
from shardsink import Shard
from shardsink.core import fate as ft
from shardsink.core import state as st
from shardsink.core.commands import AppendCommand
from shardsink.errors import InvalidUsageError
from shardsink.storage.base import Blob

NOW = "2026-01-01T00:00:00.000+00:00"


def _keys(blob: Blob, prefix: str) -> set[str]:
    return {o.key for o in blob.list(prefix)}


def test_the_handle_refuses_keys_outside_the_layout_and_deletes_nothing_of_core_generically(
        shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(table_of(rows_for("d0", 0, 10)), lower=0, upper=10, desc_id="d0")
    admin = shard.admin()
    blob.put("elsewhere.txt", b"not ours")
    blob.put("plans/0-10.json", b"{}")
    for key in ("elsewhere.txt", "parts/../elsewhere.txt", "/parts/x", ""):
        with pytest.raises(InvalidUsageError, match="not an object of the shard layout"):
            admin.get(key)
    assert admin.get("reclock.json") is None  # registered by reclock: known, just absent
    assert admin.get("plans/0-10.json") == b"{}"
    part = next(iter(_keys(blob, "parts/d0/")))
    for doomed in (["state/LATEST.json"], [part], ["leases/x.json"], ["elsewhere.txt"], ["plans/0-10.json", part]):
        with pytest.raises(InvalidUsageError, match="not a registered root object"):
            admin.delete_registered(doomed)
    assert part in _keys(blob, "parts/") and "plans/0-10.json" in _keys(blob, "plans/"), "a refusal deleted"
    with pytest.raises(InvalidUsageError, match="not a registered root folder"):
        admin.list_registered("parts/")
    assert [o.key for o in admin.list_registered("plans/")] == ["plans/0-10.json"]
    assert [o.key for o in admin.list_expiring()] == ["plans/0-10.json"]  # plans/ expire after GC's grace
    assert admin.delete_registered(["plans/0-10.json"]) == 1 and _keys(blob, "plans/") == set()
    with pytest.raises(InvalidUsageError, match="not a part of the shard layout"):
        admin.open_part(st.PartMeta("state/LATEST.json", 1, 1, 0, 0))
    with pytest.raises(InvalidUsageError, match="description id"):
        admin.builder("../x")
    assert "elsewhere.txt" in {o.key for o in admin.list_objects()}  # verify's view: listed, never deleted
    assert {o.desc_id for o in admin.list_parts()} == {"d0"}
    # The names reports give are the keys the listings hold; only core spells them.
    listed = {o.key for o in admin.list_objects()}
    state = admin.list_state()
    assert {admin.version_object(s) for s in state.versions} == {o.key for o in state.versions.values()}
    assert admin.hint_object in listed and admin.version_object(1).startswith(admin.versions_folder)
    assert admin.is_part(part) and not admin.is_part(admin.version_object(1)) and admin.is_known(part)
    assert not admin.is_known("elsewhere.txt") and admin.is_known("reclock.json")
    r = admin.rollup_now()
    assert r == 1 and admin.list_state().rollups[1].key == admin.rollup_object(1)
    cid = admin.new_compaction_id()
    assert admin.is_compaction(cid) and not admin.is_compaction("d0") and cid != admin.new_compaction_id()


def test_the_handle_commits_maintenance_commands_only(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    admin = shard.admin()
    append = AppendCommand("d0", 0, 10, ())
    with pytest.raises(InvalidUsageError, match="not AppendCommand"):
        admin.commit(append)  # type: ignore[arg-type]
    assert admin.head().seqno == 0 and admin.head().header.upper == 0


def test_delete_staged_through_the_handle_re_checks_the_fate(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    admin = shard.admin()
    staged = shard.stage(table_of(rows_for("late", 0, 10)), lower=0, upper=10, desc_id="late")
    stray = shard.stage(table_of(rows_for("late", 0, 10, count=5)), lower=0, upper=10, desc_id="late")
    mine = {p.key for p in staged.parts}
    # May still commit: refused, nothing deleted.
    stale = admin.fate("late", 0)
    assert isinstance(stale, ft.StillPossible)
    with pytest.raises(ft.DeleteRefusedError, match="may still commit"):
        admin.delete_staged("late", 0)
    assert _keys(blob, "parts/late/") == mine | {p.key for p in stray.parts}
    # It commits after the caller's read: the delete decides on a fresh read and keeps its batch.
    shard.compare_and_append([staged], expected_upper=0, new_upper=10, desc_id="late")
    gone = admin.delete_staged("late", 0)
    assert isinstance(gone.fate, ft.Committed) and gone.parts == len(stray.parts)
    assert _keys(blob, "parts/late/") == mine, "the committed batch's parts must survive a stale fate"
    assert shard.snapshot(9).num_rows == 3
    # A description that lost its race: everything it staged goes (one head read for many).
    lost = shard.stage(table_of(rows_for("lost", 0, 10)), lower=0, upper=10, desc_id="lost")
    got = admin.delete_staged_many([ft.Condemned("lost", 0, frozenset(p.key for p in lost.parts))])
    res = got["lost"]
    assert isinstance(res, ft.Deleted) and isinstance(res.fate, ft.CannotCommit) and res.parts == len(lost.parts)
    assert _keys(blob, "parts/lost/") == set()
