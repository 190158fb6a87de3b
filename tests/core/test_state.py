"""The pure commit rule and the state codec (shardsink.core.transitions, .state_codec): no I/O involved."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from shardsink.core import state as st
from shardsink.core import state_codec as sc
from shardsink.core import transitions as tr
from shardsink.core.commands import AppendCommand, Stamp
from shardsink.errors import CorruptionError

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def part(key: str, rows: int = 3, size: int = 100, lo: int = 0, hi: int = 9) -> st.PartMeta:
    return st.PartMeta(key, rows, size, lo, hi)


def cmd(desc_id: str, lower: int, upper: int | None, *parts: st.PartMeta, writer: str = "w1",
        nonce: str = "n") -> tuple[AppendCommand, Stamp]:
    return AppendCommand(desc_id, lower, upper, tuple(parts)), Stamp(writer, "2024-01-01T00:00:00.000+00:00", nonce)


def v0(upper: int = 0) -> st.Version:
    return tr.initial_version(schema=SCHEMA, upper=upper, stamp=Stamp("creator", "t0", "n0"))


def append(header: st.Header, c: tuple[AppendCommand, Stamp]) -> st.Version | tr.Refusal:
    return tr.compare_and_append(header, (), c[0], c[1])


def commit(header: st.Header, c: tuple[AppendCommand, Stamp]) -> st.Version:
    out = append(header, c)
    assert isinstance(out, st.Version), out
    return out


# --- the rule -----------------------------------------------------------------------


def test_initial_version_is_seqno_0_with_given_upper_and_no_batches() -> None:
    v = v0(upper=5)
    assert (v.seqno, v.header.upper, v.header.since, v.header.rollup) == (0, 5, 0, 0)
    assert v.added == () and v.removed == () and v.header.recent == ()
    assert v.commit.kind == "create" and v.commit.upper == 5
    assert v.header.schema.equals(SCHEMA)


def test_append_at_upper_creates_next_seqno_with_new_upper_and_batch() -> None:
    p = part("parts/d1/a.parquet")
    v = commit(v0().header, cmd("d1", 0, 10, p))
    assert v.seqno == 1
    assert v.header.upper == 10
    assert v.added == (st.BatchMeta("d1", 0, 10, 1, (p,)),)
    assert v.header.committed_seqno("d1") == 1
    c = v.commit
    assert (c.kind, c.desc_id, c.lower, c.upper, c.rows) == ("append", "d1", 0, 10, 3)


def test_append_with_seen_desc_id_is_already_committed() -> None:
    v1 = commit(v0().header, cmd("d1", 0, 10, part("a")))
    v2 = commit(v1.header, cmd("d2", 10, 20, part("b")))
    # A retry of d1 carries d1's (now stale) lower: idempotency wins over the upper check.
    assert append(v2.header, cmd("d1", 0, 10, part("c"))) == tr.AlreadyCommitted(1)


def test_upper_mismatch_reports_current_upper_and_writes_nothing() -> None:
    v1 = commit(v0().header, cmd("d1", 0, 10))
    assert append(v1.header, cmd("d2", 0, 10)) == tr.UpperMismatch(10)
    assert append(v1.header, cmd("d2", 11, 20)) == tr.UpperMismatch(10)


def test_closed_shard_refuses_append_with_empty_current_upper() -> None:
    closed = commit(v0().header, cmd("close", 0, None))
    assert closed.header.upper is None
    assert closed.commit.kind == "close"
    assert append(closed.header, cmd("d2", 0, 10)) == tr.UpperMismatch(None)


def test_empty_batch_advances_upper_without_adding_a_batch() -> None:
    v = commit(v0().header, cmd("d1", 0, 10))
    assert v.header.upper == 10 and v.seqno == 1
    assert v.added == ()
    assert v.header.stats == st.Stats()
    assert v.header.committed_seqno("d1") == 1  # an empty batch is idempotent too


def test_stats_accumulate_batches_parts_rows_and_bytes() -> None:
    v1 = commit(v0().header, cmd("d1", 0, 10, part("a", rows=3, size=100), part("b", rows=4, size=50)))
    v2 = commit(v1.header, cmd("d2", 10, 20))
    v3 = commit(v2.header, cmd("d3", 20, 30, part("c", rows=1, size=7)))
    assert v3.header.stats == st.Stats(batches=2, parts=3, rows=8, bytes=157)


def test_recent_window_remembers_exactly_the_last_128_desc_ids() -> None:
    h = v0().header
    n = tr.RECENT_DESCS + 2
    for i in range(n):
        h = commit(h, cmd(f"d{i}", i, i + 1)).header
    assert len(h.recent) == tr.RECENT_DESCS == 128
    assert h.committed_seqno("d0") is None and h.committed_seqno("d1") is None
    assert h.committed_seqno("d2") == 3
    assert h.committed_seqno(f"d{n - 1}") == n
    # Outside the window the pure rule can only see the upper (the shard handle then scans batches).
    assert append(h, cmd("d0", 0, 1)) == tr.UpperMismatch(n)
    assert append(h, cmd("d2", 2, 3)) == tr.AlreadyCommitted(3)


def test_writers_bounded_to_64_keeping_each_writers_latest_commit() -> None:
    h = v0().header
    for i in range(tr.WRITERS + 6):
        h = commit(h, cmd(f"d{i}", i, i + 1, writer=f"w{i}")).header
    assert len(h.writers) == tr.WRITERS == 64
    assert [w.writer for w in h.writers] == [f"w{i}" for i in range(6, 70)]
    assert h.upper is not None
    h = commit(h, cmd("again", h.upper, h.upper + 1, writer="w10")).header
    records = [w for w in h.writers if w.writer == "w10"]
    assert records == [st.WriterRecord("w10", "again", h.seqno, records[0].at)]
    assert h.writers[-1].writer == "w10" and len(h.writers) == 64


def test_rule_is_deterministic_for_the_same_header_and_command() -> None:
    h = v0().header
    c = cmd("d1", 0, 10, part("a"))
    assert append(h, c) == append(h, c)
    assert sc.encode_version(commit(h, c)) == sc.encode_version(commit(h, c))


def test_with_rollup_only_moves_the_pointer_forward() -> None:
    v = commit(v0().header, cmd("d1", 0, 10))
    assert tr.with_rollup(v, 32).header.rollup == 32
    newer = tr.with_rollup(v, 32)
    assert tr.with_rollup(newer, 5) is newer


# --- apply_diffs -------------------------------------------------------------------------


def test_apply_diffs_appends_added_batches_in_seqno_order_and_drops_removed_ids() -> None:
    b1 = st.BatchMeta("d1", 0, 10, 1, (part("a"),))
    b2 = st.BatchMeta("d2", 10, 20, 2, (part("b"),))
    b3 = st.BatchMeta("d3", 20, 30, 3, (part("c"),))
    h = v0().header
    info = v0().commit
    versions = [
        st.Version(h, (b2,), (), info),
        st.Version(h, (b3,), ("d1",), info),
    ]
    assert tr.apply_diffs((b1,), versions) == (b2, b3)
    assert tr.apply_diffs((), []) == ()
    assert tr.apply_diffs((b1,), [st.Version(h, (), ("nope",), info)]) == (b1,)


# --- codec ---------------------------------------------------------------------------------


def test_version_codec_round_trips_every_field() -> None:
    h = v0(upper=3).header
    v1 = commit(h, cmd("d1", 3, 10, part("parts/d1/a.parquet", 5, 999, 3, 9), writer="host:1", nonce="abc"))
    closed = commit(v1.header, cmd("d2", 10, None, writer="host:2", nonce="def"))
    for v in (v0(), v1, closed, tr.with_rollup(closed, 2)):
        back = sc.decode_version(sc.encode_version(v), where="mem")
        assert back == v
        assert back.header.schema.equals(v.header.schema)


def test_append_props_reach_the_commit_info_and_versions_without_them_still_decode() -> None:
    props = (("view.basis", "full"), ("view.fingerprint", "f00"))
    c = AppendCommand("d1", 0, 10, (), props), Stamp("w1", "2024-01-01T00:00:00.000+00:00", "n")
    v1 = commit(v0().header, c)
    assert v1.commit.props == props
    assert sc.decode_version(sc.encode_version(v1), where="mem").commit.props == props
    plain = sc.encode_version(commit(v0().header, cmd("d2", 0, 10)))
    assert b"props" not in plain  # empty props are left out: older readers see the bytes they always did
    assert sc.decode_version(plain, where="mem").commit.props == ()


def test_codec_round_trips_schema_metadata_and_types() -> None:
    schema = pa.schema(
        [pa.field("ts", pa.timestamp("ms", tz="UTC")), pa.field("x", pa.decimal128(10, 2), nullable=False)],
        metadata={b"owner": b"team-a"},
    )
    v = tr.initial_version(schema=schema, upper=0, stamp=Stamp("w", "t", "n"))
    back = sc.decode_version(sc.encode_version(v), where="mem")
    assert back.header.schema.equals(schema, check_metadata=True)


def test_encoding_is_canonical_json_with_format_2() -> None:
    data = sc.encode_version(commit(v0().header, cmd("d1", 0, 10, part("a"))))
    d = json.loads(data)
    assert d["format"] == sc.FORMAT == 2
    assert d["commit"]["kind"] == "append" and d["commit"]["upper"] == 10
    assert d["seqno"] == 1
    assert data == json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def test_rollup_codec_round_trips_the_batch_list() -> None:
    batches = (st.BatchMeta("d1", 0, 10, 1, (part("a"), part("b"))), st.BatchMeta("d2", 10, None, 2, ()))
    assert sc.decode_rollup(sc.encode_rollup(7, batches), where="mem") == (7, batches)


GARBAGE = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x00\xff garbage {", id="binary"),
    pytest.param(b"[1, 2, 3]", id="json-list"),
    pytest.param(b'{"format": 1}', id="missing-fields"),
    pytest.param(b'{"format": 99, "seqno": 0}', id="future-format"),
    pytest.param(b'{"seqno": 0}', id="no-format"),
]


@pytest.mark.parametrize("data", GARBAGE)
def test_decode_version_of_garbage_raises_corruption_naming_where(data: bytes) -> None:
    with pytest.raises(CorruptionError, match=r"s3://b/x/state/v/00000000000000000004\.json"):
        sc.decode_version(data, where="s3://b/x/state/v/00000000000000000004.json")


def test_decode_version_with_truncated_valid_encoding_is_corruption() -> None:
    data = sc.encode_version(commit(v0().header, cmd("d1", 0, 10, part("a"))))
    with pytest.raises(CorruptionError, match="here"):
        sc.decode_version(data[: len(data) // 2], where="here")


def test_decode_version_with_bad_schema_bytes_is_corruption() -> None:
    d = json.loads(sc.encode_version(v0()))
    d["header"]["schema"]["arrow"] = "bm90IGFuIGFycm93IHNjaGVtYQ=="  # base64 of junk
    with pytest.raises(CorruptionError, match="here"):
        sc.decode_version(json.dumps(d).encode(), where="here")


@pytest.mark.parametrize("data", GARBAGE)
def test_decode_rollup_of_garbage_raises_corruption_naming_where(data: bytes) -> None:
    with pytest.raises(CorruptionError, match="rollup-key"):
        sc.decode_rollup(data, where="rollup-key")
