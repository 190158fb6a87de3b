"""Every kind is complete: each command of ``commands.Command`` has its transition rule, each
record of ``commits.Commit`` says what it did in one line, and a command without a rule is a
NotImplementedError naming it (never a bare KeyError)."""

from __future__ import annotations

import typing
from dataclasses import dataclass

import pyarrow as pa
import pytest

from shardsink.core import commits as cm
from shardsink.core import transitions as tr
from shardsink.core.commands import Command, CreateCommand, Stamp

STAMP = Stamp("w", "2026-01-01T00:00:00.000+00:00", "n")
BY = {"at": STAMP.at, "writer": STAMP.writer, "nonce": STAMP.nonce}
#: One record of each kind, with what its describe() must name.
RECORDS: list[tuple[cm.CommitRecord, str]] = [
    (cm.CreateCommit(**BY, upper=5), "5"),
    (cm.AppendCommit(**BY, desc_id="d1", lower=0, upper=10, rows=3), "d1"),
    (cm.CloseCommit(**BY, desc_id="d2", lower=10, rows=0), "d2"),
    (cm.CompactCommit(**BY, compaction_id="compact-1", lower=0, upper=20, rows=4), "compact-1"),
    (cm.SinceCommit(**BY, old=0, new=15), "15"),
    (cm.RetentionCommit(**BY, old=None, new=3_600_000), "3600000"),
    (cm.SchemaCommit(**BY, old_id=0, new_id=1, change="add x: int64"), "add x: int64"),
    (cm.OptionCommit(**BY, name="iceberg", old=None, new="on"), "iceberg"),
]


def test_every_command_kind_has_a_registered_rule() -> None:
    kinds = typing.get_args(Command)
    assert kinds, "commands.Command lists no kind"
    for kind in kinds:
        assert callable(tr.rule_of(kind)), kind


def test_every_commit_record_kind_describes_itself_in_one_line() -> None:
    assert {type(r) for r, _ in RECORDS} == set(typing.get_args(cm.Commit)), "a record kind has no sample here"
    for record, names in RECORDS:
        line = record.describe()
        assert names in line and "\n" not in line, (record.kind, line)


def test_a_command_kind_without_a_rule_is_not_implemented_naming_it() -> None:
    @dataclass(frozen=True)
    class UnruledCommand:
        pass

    head = tr.apply(None, (), CreateCommand(pa.schema([("k", pa.string())]), 0), STAMP)
    assert isinstance(head, tr.Version)
    with pytest.raises(NotImplementedError, match=r"UnruledCommand.*@rule\(UnruledCommand\)"):
        tr.apply(head.header, (), UnruledCommand(), STAMP)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="UnruledCommand"):
        tr.apply(None, (), UnruledCommand(), STAMP)  # type: ignore[arg-type]
