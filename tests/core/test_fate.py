"""core/fate.py: the fate of a description from one state read, and the one deletion path."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from support import SCHEMA, rows_for, table_of

from shardsink import Shard
from shardsink.core import fate as ft
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.commits import AppendCommit, CloseCommit
from shardsink.storage.base import Blob

NOW = "2026-01-01T00:00:00.000+00:00"


def _header(upper: int | None, recent: tuple[tuple[str, int], ...] = (), *, seqno: int = 9) -> st.Header:
    return st.Header(seqno, upper, 0, pa.schema([("k", pa.string())]), 0, recent, (), st.Stats())


def _version(seqno: int, desc_id: str, lower: int, upper: int | None, keys: tuple[str, ...]) -> st.Version:
    parts = tuple(st.PartMeta(k, 2, 10, lower, lower) for k in keys)
    batch = (st.BatchMeta(desc_id, lower, upper, seqno, parts),) if parts else ()
    info = (AppendCommit(at=NOW, writer="w", nonce="n", desc_id=desc_id, lower=lower, upper=upper, rows=2 * len(parts))
            if upper is not None else
            CloseCommit(at=NOW, writer="w", nonce="n", desc_id=desc_id, lower=lower, rows=2 * len(parts)))
    return st.Version(_header(upper, seqno=seqno), batch, (), info)


def test_decide_is_committed_with_the_exact_keys_of_its_batch() -> None:
    v = _version(2, "d", 10, 20, ("parts/d/a.parquet", "parts/d/b.parquet"))
    got = ft.decide(ft.Evidence(_header(30, (("d", 2),)), v), "d", 10)
    assert got == ft.Committed(2, frozenset({"parts/d/a.parquet", "parts/d/b.parquet"}), 4)


def test_decide_cannot_commit_once_the_upper_passed_or_the_shard_closed() -> None:
    other = _version(2, "rival", 10, 20, ("parts/rival/a.parquet",))
    assert ft.decide(ft.Evidence(_header(20), other), "d", 10) == ft.CannotCommit(20)
    assert ft.decide(ft.Evidence(_header(None), other), "d", 10) == ft.CannotCommit(None)


def test_decide_still_possible_while_the_upper_has_not_passed_the_lower() -> None:
    assert ft.decide(ft.Evidence(_header(10), None), "d", 10) == ft.StillPossible(10)
    assert ft.decide(ft.Evidence(_header(5), None), "d", 10) == ft.StillPossible(5)


def test_decide_finds_a_batch_committed_before_the_horizon_in_the_batch_list_there() -> None:
    crossing = _version(7, "later", 30, 40, ())
    horizon = (st.BatchMeta("d", 10, 20, 2, (st.PartMeta("parts/d/a.parquet", 1, 5, 10, 10),)),)
    got = ft.decide(ft.Evidence(_header(50), crossing, horizon), "d", 10)
    assert got == ft.Committed(2, frozenset({"parts/d/a.parquet"}), 1)


def test_fate_beyond_the_idempotency_window_is_found_by_the_crossing_search(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/long"
    shard = Shard.create(url, SCHEMA)
    early = shard.append(table_of(rows_for("early", 0, 10)), lower=0, upper=10, desc_id="early")
    for i in range(1, tr.RECENT_DESCS + 40):
        shard.append(table_of([]), lower=10 * i, upper=10 * (i + 1), desc_id=f"later-{i}")
    assert shard._machine.head().version.header.committed_seqno("early") is None
    fresh = Shard(url)
    got = fresh.fate("early", 0)
    assert isinstance(got, ft.Committed) and got.seqno == early.seqno
    assert got.keys == {p.key for b in fresh.batches() if b.desc_id == "early" for p in b.parts}
    assert fresh.fate("never", 0) == ft.CannotCommit(fresh.info().upper)
    assert fresh.fate("never", 55) == ft.CannotCommit(fresh.info().upper)  # mid-batch lower
    # a lost race a moment ago costs a handful of reads, not a walk of the history
    probe = Shard(url)
    requests = {"n": 0}
    inner_get = probe._machine.raw.get

    def counting_get(key: str) -> Any:
        requests["n"] += 1
        return inner_get(key)

    probe._machine.raw.get = counting_get  # type: ignore[method-assign]
    upper = probe.info().upper
    assert upper is not None
    requests["n"] = 0
    assert probe.fate("lost-just-now", upper - 10) == ft.CannotCommit(upper)
    assert requests["n"] <= 4


def test_delete_staged_refuses_while_the_description_may_still_commit(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    staged = shard.stage(table_of(rows_for("d", 0, 10)), lower=0, upper=10, desc_id="d")
    with pytest.raises(ft.DeleteRefusedError, match="may still commit"):
        ft.delete_staged(shard._machine, "d", 0)
    with pytest.raises(ft.DeleteRefusedError):
        shard.discard([staged])
    assert {o.key for o in blob.list("parts/")} == {p.key for p in staged.parts}


def test_delete_staged_never_touches_a_committed_key_or_a_key_outside_the_prefix(
    shard_url: str, blob: Blob
) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    other = shard.append(table_of(rows_for("other", 0, 5)), lower=0, upper=5, desc_id="other")
    assert other.status == "committed"
    kept = shard.stage(table_of(rows_for("d", 5, 10)), lower=5, upper=10, desc_id="d")
    shard.compare_and_append([kept], expected_upper=5, new_upper=10, desc_id="d")
    leftover = shard.stage(table_of(rows_for("d2", 5, 10)), lower=5, upper=10, desc_id="d")
    foreign = {p.key for b in shard.batches() if b.desc_id == "other" for p in b.parts}
    gone = ft.delete_staged(shard._machine, "d", 5, only={*foreign, *(p.key for p in kept.parts),
                                                        *(p.key for p in leftover.parts)})
    assert isinstance(gone.fate, ft.Committed) and gone.parts == len(leftover.parts)
    present = {o.key for o in blob.list("parts/")}
    assert present == foreign | {p.key for p in kept.parts}
    assert shard.snapshot().num_rows == 6
