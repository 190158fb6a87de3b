"""``shardsink verify``: exit 0 on a clean shard, exit 4 naming the object of each corruption."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import replace

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gc_helpers import SCHEMA, append_days

from shardsink import Shard
from shardsink.cli import main
from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core.keys import version_key


@pytest.fixture
def shard(shard_url: str) -> Shard:
    s = Shard.create(shard_url, SCHEMA)
    append_days(s, 0, 5)
    return s


def _verify(url: str, capsys: pytest.CaptureFixture[str], *,  # type: ignore[type-arg]
            clock: Callable[[], float] = time.time) -> tuple[int, dict]:
    code = main(["verify", url, "--json"], clock=clock)
    return code, json.loads(capsys.readouterr().out)


def _rewrite(shard: Shard, seqno: int, change: object) -> None:
    got = shard._machine.blob.get(version_key(seqno))
    assert got is not None
    v = sc.decode_version(got.data, where="test")
    shard._machine.blob.put(version_key(seqno), sc.encode_version(change(v)))  # type: ignore[operator]


def _part_of(shard: Shard, desc_id: str) -> st.PartMeta:
    return next(p for b in shard.batches() if b.desc_id == desc_id for p in b.parts)


def test_clean_shard_exits_0_with_the_json_shape_and_a_dead_writers_part_leaks_after_the_grace_period(
        shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    shard.stage(pa.table({"k": ["x"], "_time": [1]}), lower=0, upper=10, desc_id="leftover")  # upper 50 passed it
    code, out = _verify(shard.url, capsys)
    assert code == 0
    assert set(out) == {"url", "ok", "head", "oldest", "versions", "parts", "problems", "leaks", "in_flight",
                        "objects"}
    assert (out["ok"], out["head"], out["oldest"], out["versions"], out["parts"], out["problems"]) == (
        True, 5, 0, 6, 5, [])
    # Younger than the grace period: its writer may still be deleting it. Past it: leaked.
    assert [x["object"].split("/")[1] for x in out["in_flight"]] == ["leftover"] and out["leaks"] == []
    code, out = _verify(shard.url, capsys, clock=lambda: time.time() + 3601)
    assert [(x["kind"], x["object"].split("/")[1]) for x in out["leaks"]] == [("part", "leftover")]
    assert set(out["leaks"][0]) == {"object", "kind", "bytes", "age_s"} and out["in_flight"] == []
    assert {c: n["count"] for c, n in out["objects"]["counts"].items()} == {
        "live": 5, "retained": 0, "in_flight": 0, "leaked": 1}
    assert main(["verify", shard.url]) == 0
    assert ": ok;" in capsys.readouterr().out


def test_missing_part(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    p = _part_of(shard, "d2")
    shard._machine.blob.delete(p.key)
    code, out = _verify(shard.url, capsys)
    assert code == 4
    assert [(x["object"], "missing" in x["message"]) for x in out["problems"]] == [(p.key, True)]


def test_wrong_byte_size(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    p = _part_of(shard, "d1")
    got = shard._machine.blob.get(p.key)
    assert got is not None
    shard._machine.blob.put(p.key, got.data + b"trailing")
    code, out = _verify(shard.url, capsys)
    assert code == 4 and out["problems"][0]["object"] == p.key and "bytes" in out["problems"][0]["message"]


def test_wrong_row_count(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    p = _part_of(shard, "d4")  # committed by version 5, after the last rollup
    _rewrite(shard, 5, lambda v: replace(v, added=tuple(
        msgspec.structs.replace(b, parts=tuple(msgspec.structs.replace(x, rows=x.rows + 1) for x in b.parts))
        for b in v.added)))
    code, out = _verify(shard.url, capsys)
    assert code == 4
    assert [x["object"] for x in out["problems"]] == [p.key] and "rows" in out["problems"][0]["message"]


def test_missing_version_in_the_chain(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    shard._machine.blob.delete(version_key(3))
    code, out = _verify(shard.url, capsys)
    assert code == 4 and version_key(3) in [x["object"] for x in out["problems"]]


def test_upper_moving_back(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(shard, 3, lambda v: replace(v, header=replace(v.header, upper=5)))
    code, out = _verify(shard.url, capsys)
    assert code == 4
    assert any(x["object"] == version_key(3) and "upper moved back" in x["message"] for x in out["problems"])


def test_since_past_upper(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(shard, 2, lambda v: replace(v, header=replace(v.header, since=10_000)))
    code, out = _verify(shard.url, capsys)
    assert code == 4 and any(x["object"] == version_key(2) and "since" in x["message"] for x in out["problems"])


def test_negative_multiplicity(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    shard.append(pa.table({"k": ["ghost"], "_time": [50], "_diff": [-1]}), lower=50, upper=60, desc_id="neg")
    code, out = _verify(shard.url, capsys)
    assert code == 4
    assert [x["object"] for x in out["problems"]] == [f"{shard.url} as_of 59"]
    assert "negative multiplicity" in out["problems"][0]["message"]


def test_undecodable_version_is_named(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    shard._machine.blob.put(version_key(2), b"{not json")
    assert main(["verify", shard.url]) == 4
    assert f"PROBLEM {version_key(2)}" in capsys.readouterr().out


def test_a_real_parquet_with_another_row_count_is_caught(shard: Shard, capsys: pytest.CaptureFixture[str]) -> None:
    """Same key, same recorded size cannot be forged cheaply; a rewritten part of another size is
    caught by size, and its row count shows in the message of a size-preserving rewrite too."""
    p = _part_of(shard, "d0")
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": ["a", "b", "c"], "_time": [0, 1, 2], "_diff": [1, 1, 1]}), buf)
    shard._machine.blob.put(p.key, buf.getvalue())
    code, out = _verify(shard.url, capsys)
    assert code == 4 and out["problems"][0]["object"] == p.key


@pytest.mark.usefixtures("small_windows")
def test_a_version_left_below_a_gap_is_reported_not_crashed_on(shard_url: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """What a forked history looks like (a writer re-created a collected version): an old
    version, a gap, then the retained chain from an anchored rollup."""
    s = Shard.create(shard_url, SCHEMA)
    append_days(s, 0, 6)
    for seqno in (1, 2, 3):
        s._machine.blob.delete(version_key(seqno))
    code, out = _verify(s.url, capsys)
    assert code == 4
    assert [x["object"] for x in out["problems"]] == [version_key(n) for n in (1, 2, 3)]
