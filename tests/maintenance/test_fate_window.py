"""A late retry is never told "not committed" unless that is known (issue 17 items 3 and 4).

After compaction merged a description's batch and GC removed the version that committed
it, the fate is read from the records the retained history keeps: a compacted batch's
lineage (the descriptions it merged, with their bounds). An exact retry is "already
committed" (exit 0); a request reusing the id with other bounds is refused (exit 2); a
description that a record proves never committed is "not committed" (exit 3); where no
record tells, the answer is "unknown" (FateUnknownError, exit 5), never "not committed".
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gc_helpers import SCHEMA, SPAN, append_days, rows

from shardsink import DescriptionConflictError, FateUnknownError, Shard
from shardsink.cli import main
from shardsink.core import fate as ft
from shardsink.core import machine
from shardsink.core import transitions as tr
from shardsink.maintenance import CompactOptions, ScheduleOptions, compact, set_retention
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.maintenance.since import advance_since


def _input(tmp_path: Path, t: pa.Table, name: str) -> str:
    f = tmp_path / f"{name}.parquet"
    pq.write_table(t, f)
    return str(f)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _age_out(shard: Shard, first_seqno: int) -> None:
    """Compact everything, append past it, keep little history, and GC past the compaction
    (so no retained version lists the first batch by name: only lineage can tell)."""
    compacted: list[int] = []
    for _ in range(8):
        res = compact(shard, options=CompactOptions(schedule=ScheduleOptions(fan_in=2)))
        compacted += [m.seqno for m in res.merges if m.status == "applied" and m.seqno is not None]
        if not res.applied:
            break
    assert compacted, "nothing was compacted"
    upper = shard.info().upper
    assert upper is not None
    # GC keeps the idempotency window's versions, back to a rollup: append past both
    append_days(shard, upper // SPAN, tr.RECENT_DESCS + machine.ROLLUP_EVERY + 8)
    set_retention(shard, 3 * SPAN)
    advance_since(shard)
    collect(shard, GcOptions(grace_s=0.0))
    assert shard._machine.fetch(first_seqno) is None, "GC did not remove the committing version"
    assert shard._machine.fetch(max(compacted)) is None, "GC did not remove the compactions"


@pytest.mark.usefixtures("small_windows")
def test_a_late_exact_retry_after_compaction_and_gc_is_already_committed(
        shard_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    first = shard.append(rows(0), lower=0, upper=SPAN, desc_id="late")
    shard.append(pa.table({"k": pa.array([], pa.string()), "_time": pa.array([], pa.int64())}),
                 lower=SPAN, upper=2 * SPAN, desc_id="empty")  # an empty batch leaves no record
    append_days(shard, 2, 30)
    _age_out(shard, first.seqno)
    assert "late" not in {b.desc_id for b in shard.batches()}  # merged away by compaction
    before = shard.snapshot().sort_by("k")

    late = _input(tmp_path, rows(0), "late")
    code, out, err = _cli(["append", shard_url, "--lower", "0", "--upper", str(SPAN), "--input", late,
                           "--desc-id", "late"], capsys)
    assert code == 0 and "already committed" in out, (out, err)
    assert shard.snapshot().sort_by("k").equals(before)  # not appended twice

    code, _, err = _cli(["append", shard_url, "--lower", "0", "--upper", str(2 * SPAN), "--input", late,
                         "--desc-id", "late"], capsys)
    assert code == 2 and f"[0, {SPAN})" in err and f"[0, {2 * SPAN})" in err, err

    code, _, err = _cli(["append", shard_url, "--lower", "0", "--upper", str(SPAN), "--input", late,
                         "--desc-id", "never"], capsys)
    assert code == 3 and "was not committed" in err, err  # "late" sealed time 0: known

    for desc in ("empty", "other"):  # nothing retained says who sealed [SPAN, 2 SPAN)
        code, _, err = _cli(["append", shard_url, "--lower", str(SPAN), "--upper", str(2 * SPAN), "--input",
                             _input(tmp_path, rows(1), desc), "--desc-id", desc], capsys)
        assert code == 5 and "unknown" in err and "not committed" not in err, (desc, err)
    assert isinstance(shard.fate("empty", SPAN), ft.Unknown)
    assert shard.snapshot().sort_by("k").equals(before)

    # `gc --desc` never deletes on an unknown fate: exit 5, the description's objects stay.
    staged = shard.stage(rows(1), lower=SPAN, upper=2 * SPAN, desc_id="empty")
    code, _, err = _cli(["gc", shard_url, "--desc", "empty"], capsys)
    assert code == 5 and "is not known" in err and "nothing deleted" in err, err
    assert {o.key for o in shard._machine.blob.list("parts/empty/")} == {p.key for p in staged.parts}


def test_the_exact_reported_sequence_with_default_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 item 3 as reported: D, then 450 more appends, compact, retention, GC past D."""
    url = f"file://{tmp_path}/shard"
    shard = Shard.create(url, SCHEMA)
    first = shard.append(rows(0), lower=0, upper=SPAN, desc_id="D")
    append_days(shard, 1, 450)
    _age_out(shard, first.seqno)
    code, out, err = _cli(["append", url, "--lower", "0", "--upper", str(SPAN), "--input",
                           _input(tmp_path, rows(0), "d"), "--desc-id", "D"], capsys)
    assert code == 0 and "already committed" in out, (out, err)


def test_an_id_reused_with_other_bounds_is_refused_and_nothing_is_written(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    shard.append(rows(0), lower=0, upper=SPAN, desc_id="d")
    keys = {o.key for o in shard._machine.blob.list("")}
    with pytest.raises(DescriptionConflictError, match=rf"\[0, {SPAN}\).*\[{SPAN}, {2 * SPAN}\)") as e:
        shard.append(rows(1), lower=SPAN, upper=2 * SPAN, desc_id="d")
    assert e.value.exit_code == 2
    staged = shard.stage(rows(0), lower=0, upper=2 * SPAN, desc_id="d")
    with pytest.raises(DescriptionConflictError):
        shard.compare_and_append([staged], expected_upper=0, new_upper=2 * SPAN, desc_id="d")
    shard.discard([staged])
    assert {o.key for o in shard._machine.blob.list("")} == keys
    assert shard.append(rows(0), lower=0, upper=SPAN, desc_id="d").status == "already_committed"


@pytest.mark.usefixtures("small_windows")
def test_unknown_is_its_own_error_for_the_python_api(shard_url: str) -> None:
    shard = Shard.create(shard_url, SCHEMA)
    first = shard.append(pa.table({"k": pa.array([], pa.string()), "_time": pa.array([], pa.int64())}),
                         lower=0, upper=SPAN, desc_id="empty")
    append_days(shard, 1, 20)
    _age_out(shard, first.seqno)
    with pytest.raises(FateUnknownError, match="unknown") as e:
        shard.append(rows(0), lower=0, upper=SPAN, desc_id="empty")
    assert e.value.exit_code == 5
