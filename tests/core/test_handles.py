"""core/write.py and core/read.py: the write and read handles do what Shard does, through the one
batch builder, the one compare-and-set loop and the one deleter; nothing above core needs the
machine, the blob or a key."""

from __future__ import annotations

import pickle
import re

import pyarrow as pa
import pytest
from support import SCHEMA, rows_for, table_of

from shardsink import Shard, StagedBatch
from shardsink.core import fate as ft
from shardsink.core import keys
from shardsink.core import manifests as mf
from shardsink.core import state as st
from shardsink.core import transitions as tr
from shardsink.core.builder import PartOptions, PartWriterSpec
from shardsink.core.commands import AppendCommand, CreateCommand, RetentionCommand, SinceCommand
from shardsink.core.machine import Machine
from shardsink.core.updates import validate_updates
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
    # The lost append cleaned up after itself: every part is a committed batch's.
    assert {o.key for o in blob.list("parts/")} == {p.key for b in shard.batches() for p in b.parts}
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
    m = shard._machine  # what GC does, done by hand: anchor version 2, delete what is older
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
    for other, family in ((RetentionCommand(1000), "maintenance"), (CreateCommand(SCHEMA, 0), "create"),
                          (SinceCommand(None, 5), "maintenance"), ("append", None)):
        name = type(other).__name__
        with pytest.raises(InvalidUsageError, match=rf"commits appends and closes, not {name} \(family {family!r}"):
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


def test_an_executor_writes_parts_from_the_handles_picklable_spec_and_a_dry_run_uploads_nothing(
        shard_url: str, blob: Blob) -> None:
    w = Shard.create(shard_url, SCHEMA, blob=blob).writer()
    updates = validate_updates(table_of(rows_for("d", 0, 10)), SCHEMA, lower=0, upper=10)
    spec = w.part_writer("d", label="corrects-0_10", order="unordered", target_bytes=1 << 20)
    shipped = pickle.loads(pickle.dumps(spec))  # what reaches an executor
    assert shipped == spec and isinstance(shipped, PartWriterSpec) and shipped.url == w.url
    parts = shipped.open().stage(updates, [*SCHEMA.names, "_time"])
    mine = f"{w.parts_prefix('d', label='corrects-0_10')}/"
    assert [p.order for p in parts] == ["unordered"] and all(p.key.startswith(mine) for p in parts)
    assert w.list_staged("d") == {p.key for p in parts}, "labelled parts are the description's"
    assert spec.fresh_key().startswith(mine) and spec.fresh_key() != spec.fresh_key()
    dry = w.part_writer("d", dry_run=True).open().stage(updates, [*SCHEMA.names, "_time"])
    assert sum(p.rows for p in dry) == 3 and w.list_staged("d") == {p.key for p in parts}, "a dry run uploads nothing"
    assert w.manifest_key("d", 2) == keys.manifest_key("d", 2)
    for bad, named in ((lambda: w.part_writer("../x"), "'../x'"), (lambda: w.part_writer("d", label="a/b"), "'a/b'"),
                       (lambda: w.part_writer("d", target_bytes=0), "got 0"),
                       (lambda: w.part_writer("d", order="random"), "'random'"),  # type: ignore[arg-type]
                       (lambda: w.part_writer("d", dry_run="yes"), "'yes'"),  # type: ignore[arg-type]
                       (lambda: w.manifest_key("d", -1), "-1"), (lambda: w.builder("d", label=""), "''")):
        with pytest.raises(InvalidUsageError, match=re.escape(named)):
            bad()
    assert w.list_staged("d") == {p.key for p in parts}, "a refused spec writes nothing"


def test_discarding_unpublished_parts_deletes_them_while_the_description_may_commit_and_keeps_committed_ones(
        shard_url: str, blob: Blob) -> None:
    w = Shard.create(shard_url, SCHEMA, blob=blob).writer()
    staged = w.stage(table_of(rows_for("d", 0, 10)), lower=0, upper=10, desc_id="d")
    with pytest.raises(ft.DeleteRefusedError, match="may still commit"):
        w.discard([staged])
    assert w.list_staged("d") == {p.key for p in staged.parts}, "a published part is never deleted in flight"
    assert w.discard([staged], unpublished=True) == len(staged.parts) and w.list_staged("d") == frozenset()
    committed = w.stage(table_of(rows_for("e", 0, 10)), lower=0, upper=10, desc_id="e")
    extra = w.stage(table_of(rows_for("e2", 0, 10)), lower=0, upper=10, desc_id="e")
    assert w.compare_and_append([committed], expected_upper=0, new_upper=10, desc_id="e").status == "committed"
    both = StagedBatch("e", 0, 10, committed.parts + extra.parts)
    assert w.discard([both], unpublished=True) == len(extra.parts), "the fate still keeps a committed batch's parts"
    assert w.list_staged("e") == {p.key for p in committed.parts}
    with pytest.raises(InvalidUsageError, match="sequence of StagedBatch"):
        w.discard(both, unpublished=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError, match="unpublished takes only= parts"):
        ft.delete_staged(Machine(blob), "e", 0, unpublished=True)  # the whole prefix: never vouched for
