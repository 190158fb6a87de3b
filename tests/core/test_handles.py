"""core/write.py and core/read.py: the write and read handles do what Shard does, through the one
batch builder, the one compare-and-set loop and the one deleter; nothing above core needs the
machine, the blob or a key."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support import SCHEMA, rows_for, table_of

from shardsink import Shard
from shardsink.core import fate as ft
from shardsink.core import keys
from shardsink.core import manifests as mf
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.builder import PartOptions
from shardsink.core.commands import AppendCommand, CreateCommand, RetentionCommand, SinceCommand
from shardsink.errors import CorruptionError, InvalidUsageError, UpperMismatchError
from shardsink.storage.base import Blob

NOW = "2026-01-01T00:00:00.000+00:00"


def _manifest(desc_id: str, slot: int, parts: tuple[st.PartMeta, ...]) -> mf.ManifestDoc:
    return mf.ManifestDoc(format=mf.MANIFEST_FORMAT, desc_id=desc_id, lower=0, upper=10, attempt=1, slot=slot,
                          slots=2, rows=sum(p.rows for p in parts), parts=parts)


def test_the_write_handle_stages_commits_and_reports_a_retry_as_shard_does(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    w = shard.writer()
    staged = w.stage(table_of(rows_for("d", 0, 10)), lower=0, upper=10, desc_id="d")
    assert staged.rows == 3 and all(p.key.startswith(f"{keys.parts_prefix('d')}/") for p in staged.parts)
    got = w.compare_and_append([staged], expected_upper=0, new_upper=10, desc_id="d")
    assert got.status == "committed" and shard.info().upper == 10
    again = Shard(shard_url, blob=blob).writer().compare_and_append([staged], expected_upper=0, new_upper=10,
                                                                     desc_id="d")
    assert again.status == "already_committed" and again.seqno == got.seqno
    assert w.fate("d", 0) == shard.fate("d", 0) and isinstance(w.fate("d", 0), ft.Committed)
    appended = w.append(table_of(rows_for("e", 10, 20)), lower=10, upper=20, desc_id="e")
    assert appended.status == "committed"
    with pytest.raises(UpperMismatchError):
        w.append(table_of(rows_for("f", 10, 20)), lower=10, upper=20, desc_id="f")
    assert shard.leaked_parts() == []  # the lost append cleaned up after itself
    assert shard.snapshot().num_rows == 6


def test_a_builders_parts_get_fresh_keys_under_the_descriptions_prefix(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    w = shard.writer()
    updates = table_of(rows_for("d", 0, 10, count=5))
    first = w.builder("d", options=PartOptions(target_bytes=1)).stage(updates, [*SCHEMA.names, "_time"])
    second = w.builder("d").stage(updates, [*SCHEMA.names, "_time"])  # the same rows again: a retried task
    labelled = w.builder("d", label="corrects-0_10").stage(updates, [*SCHEMA.names, "_time"])
    every = [p.key for p in (*first, *second, *labelled)]
    assert len(first) > 1 and len(set(every)) == len(every)  # no key reused, none overwritten
    assert all(k.startswith("parts/d/") and k.endswith(".parquet") for k in every)
    assert all(p.key.startswith("parts/d/corrects-0_10/") for p in labelled)
    assert w.list_staged("d") == frozenset(every) == {o.key for o in blob.list("parts/")}


def test_a_writers_delete_staged_refuses_while_the_description_may_still_commit(
        shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    w = shard.writer()
    staged = w.stage(table_of(rows_for("d", 0, 10)), lower=0, upper=10, desc_id="d")
    w.put_manifest(_manifest("d", 0, staged.parts))
    assert isinstance(w.fate("d", 0), ft.StillPossible)
    with pytest.raises(ft.DeleteRefusedError, match="may still commit"):
        w.delete_staged("d", 0)
    with pytest.raises(ft.DeleteRefusedError):
        w.discard([staged])
    assert w.list_staged("d") == {p.key for p in staged.parts}
    assert w.get_manifest("d", 0) is not None


def test_a_writers_delete_staged_on_an_unknown_fate_keeps_the_answer_unknown(tmp_path: object) -> None:
    """Unknown (the sealing version is older than the retained history, and no record tells):
    the writer never answers "not committed"; what nothing retained references may go."""
    url = f"file://{tmp_path}/unknown"
    shard = Shard.create(url, SCHEMA)
    shard.append(table_of([]), lower=0, upper=10, desc_id="empty")  # an empty batch leaves no record
    shard.append(table_of(rows_for("b", 10, 20)), lower=10, upper=20, desc_id="b")
    leftover = shard.writer().stage(table_of(rows_for("other", 0, 10)), lower=0, upper=10, desc_id="other")
    m = shard.machine  # what GC does, done by hand: anchor version 2, delete what is older
    assert m.rollup_now() == 2
    m.anchor(2, m.full_batches(m.head().version))
    m.delete_versions([0, 1])
    w = Shard(url).writer()
    fate = w.fate("other", 0)
    assert isinstance(fate, ft.Unknown)
    gone = w.delete_staged("other", 0)
    assert isinstance(gone.fate, ft.Unknown) and gone.parts == len(leftover.parts)
    assert w.list_staged("other") == frozenset()
    assert {b.desc_id for b in Shard(url).batches()} == {"b"}


def test_manifests_round_trip_through_the_writer(shard_url: str, blob: Blob) -> None:
    w = Shard.create(shard_url, SCHEMA, blob=blob).writer()
    staged = w.stage(table_of(rows_for("d", 0, 10)), lower=0, upper=10, desc_id="d")
    doc = _manifest("d", 1, staged.parts)
    assert w.put_manifest(doc) == keys.manifest_key("d", 1)
    assert w.get_manifest("d", 1) == doc
    assert w.get_manifest("d", 0) is None
    blob.put(keys.manifest_key("d", 0), b"{not json")
    with pytest.raises(CorruptionError, match="slot-0"):
        w.get_manifest("d", 0)


def test_a_writers_commit_takes_appends_only_and_returns_the_version_or_a_refusal(
        shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    w = shard.writer()
    out = w.commit(AppendCommand("d1", 0, 10, ()), writer="w")
    assert isinstance(out, st.Version) and out.header.upper == 10 and out.commit.writer == "w"
    refused = w.commit(AppendCommand("d2", 0, 20, ()))
    assert refused == tr.UpperMismatch(10)
    for other in (RetentionCommand(1000), CreateCommand(SCHEMA, 0), SinceCommand(None, 5)):
        with pytest.raises(InvalidUsageError, match="commits appends and closes"):
            w.commit(other)  # type: ignore[arg-type]
    assert shard.info().seqno == 1


def test_the_read_handle_reads_what_shard_reads(shard_url: str, blob: Blob) -> None:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    for i, d in enumerate(("a", "b", "c")):
        shard.append(table_of(rows_for(d, 10 * i, 10 * (i + 1))), lower=10 * i, upper=10 * (i + 1), desc_id=d)
    r = Shard(shard_url, blob=blob).reader()
    head = r.head()
    assert head.seqno == 3 and head.header.upper == 30 and r.info() == shard.info()
    assert r.version(1) is not None and r.version(1).commit.desc_id == "a"  # type: ignore[union-attr]
    assert r.version(99) is None
    assert [v.seqno for v in r.versions([3, 1])] == [3, 1]
    assert r.batches(head) == r.batches() == shard.batches()
    assert r.log(limit=2) == shard.log(limit=2)
    assert r.snapshot(15).sort_by("k").equals(shard.snapshot(15).sort_by("k"))
    assert r.changes(10, 30).sort_by("k").equals(shard.changes(10, 30).sort_by("k"))
    parts = [p for b in r.batches(head) for p in b.parts]
    data = r.read_parts(parts, head.header.schema)
    assert data.num_rows == 9 and set(data.column_names) >= {"k", "n", "_time", "_diff"}
    assert r.open_part(parts[0]).metadata.num_rows == parts[0].rows
    assert r.leases() == shard.leases() == [] and r.min_leased_as_of() is None
    assert r.schema == shard.schema == pa.schema(SCHEMA)
