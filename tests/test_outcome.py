"""Typed outcome records (shardsink.outcome): the closed set of error classes round-trips,
executor-carried errors decode exactly, and anything else is UnexpectedError."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsink import errors as E
from shardsink.outcome import (
    CarriedError,
    ErrorRecord,
    JobOutcome,
    carry_errors,
    error_from_record,
    read_outcome,
    record_of,
    write_outcome,
)
from shardsink.sources.landing import LateDataError


@pytest.mark.parametrize(("raised", "cls"), [
    (LateDataError("late file x.csv: time 5", value=5), E.InvalidUsageError),
    (E.ShardNotFoundError("no shard at s3://b/x"), E.InvalidUsageError),
    (E.StorageError("GET x: 503 SlowDown"), E.StorageError),
    (E.StorageError("no such bucket", retryable=False), E.StorageError),
    (E.CorruptionError("part parts/d/p.parquet is missing"), E.CorruptionError),
    (E.UnknownOutcomeError("PUT x: 409"), E.UnknownOutcomeError),
    (E.UpperMismatchError("upper is 7", expected=5, current=7), E.UpperMismatchError),
    (E.LeaseLostError("lease gone"), E.LeaseLostError),
])
def test_every_error_class_round_trips_through_a_record_file(raised: E.ShardsinkError, cls: type, tmp_path: Path
                                                             ) -> None:
    path = tmp_path / "outcome.json"
    write_outcome(path, JobOutcome(ok=False, error=record_of(raised)))
    outcome = read_outcome(path)
    assert outcome is not None and not outcome.ok and outcome.error is not None
    back = error_from_record(outcome.error)
    assert type(back) is cls
    assert str(raised) in str(back) and back.value == raised.value
    assert getattr(back, "retryable", None) == getattr(raised, "retryable", None)
    assert getattr(back, "current", None) == getattr(raised, "current", None)


def test_an_error_carried_from_an_executor_decodes_exactly_from_sparks_text() -> None:
    @carry_errors
    def stage(_: object) -> object:
        raise LateDataError('late file s3://b/in/"odd"\nname.csv: time 42', value=42)
        yield

    with pytest.raises(CarriedError) as info:
        list(stage(None))
    # What Spark shows on the driver: the worker's traceback text, with more text after the record.
    text = f"PythonException: Traceback...\nshardsink.outcome.CarriedError: {info.value} SQLSTATE: 39000\n  at ..."
    rec = record_of(RuntimeError(text))
    assert rec == ErrorRecord(error_class="InvalidUsageError", raised="LateDataError",
                              message='late file s3://b/in/"odd"\nname.csv: time 42', value="42")


def test_anything_else_is_unexpected_and_maps_to_no_shardsink_class(tmp_path: Path) -> None:
    rec = record_of(RuntimeError("java.lang.OutOfMemoryError: Java heap space\nmore"))
    assert rec.error_class == "UnexpectedError" and rec.message == "java.lang.OutOfMemoryError: Java heap space"
    assert error_from_record(rec) is None
    (tmp_path / "half.json").write_bytes(b'{"ok": fal')
    assert read_outcome(tmp_path / "half.json") is None and read_outcome(tmp_path / "absent.json") is None
