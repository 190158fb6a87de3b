"""Typed outcome records: how a failure crosses a process boundary without matching text.

A shardsink spark-submit job ends by writing ONE :class:`JobOutcome` (msgspec JSON) to
a result path its caller chose (``--result-path``, one per try). The caller reads it
after spark-submit returns or fails and rebuilds the error with :func:`error_from_record`:
the same :mod:`shardsink.errors` class the library raised, so a write task decides
exactly as an in-process task does (see ``shardsink.airflow.failures``).

``error_class`` is a closed set: the classes of :mod:`shardsink.errors` that say what the
caller should do, plus ``"UnexpectedError"`` for anything that is not a ShardsinkError
(a Python bug, an out-of-memory JVM): retried, never classified by guessing.

Errors raised on Spark executors reach the driver only as text inside Spark's own
exception. Executor functions are wrapped by :func:`carry_errors`, which re-raises a
ShardsinkError as :class:`CarriedError` whose message is :data:`MARK` + the record's
JSON on one line; :func:`record_of` finds that exact marker and decodes the record.
SUBTLE: this is the only place text is inspected, and only for a marker we wrote
ourselves with a payload we parse strictly; an exception without it is
``UnexpectedError``, never a guess from class names.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from shardsink import errors as E

FORMAT = "shardsink.job-outcome/1"
MARK = "SHARDSINK_ERROR_RECORD="

ErrorClass = Literal[
    "InvalidUsageError",
    "UpperMismatchError",
    "UnknownOutcomeError",
    "StorageError",
    "LeaseLostError",
    "CorruptionError",
    "UnexpectedError",
]

#: The closed set, most specific first (a raised class maps to the first it derives from).
CLASSES: dict[ErrorClass, type[E.ShardsinkError]] = {
    "InvalidUsageError": E.InvalidUsageError,
    "UpperMismatchError": E.UpperMismatchError,
    "UnknownOutcomeError": E.UnknownOutcomeError,
    "StorageError": E.StorageError,
    "LeaseLostError": E.LeaseLostError,
    "CorruptionError": E.CorruptionError,
}


class ErrorRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One failure: what to do (``error_class``), what was raised, the message and the value."""

    error_class: ErrorClass
    raised: str  # the raised class's own name, e.g. LateDataError (for people, not for decisions)
    message: str
    value: str | None = None  # the offending value, when the error named one
    retryable: bool | None = None  # StorageError only
    expected: int | None = None  # UpperMismatchError only
    current: int | None = None  # UpperMismatchError only


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a job reports: ``ok`` with its summary, or the error record."""

    format: str = FORMAT
    ok: bool
    summary: dict[str, Any] | None = None
    error: ErrorRecord | None = None


_encoder = msgspec.json.Encoder()
_outcome = msgspec.json.Decoder(JobOutcome)


def _of_shardsink(e: E.ShardsinkError) -> ErrorRecord:
    cls: ErrorClass = "UnexpectedError"
    for name, klass in CLASSES.items():
        if isinstance(e, klass):
            cls = name
            break
    if isinstance(e, E.ConditionFailedError):  # definitely not applied: a storage failure
        cls = "StorageError"
    return ErrorRecord(
        error_class=cls, raised=type(e).__name__, message=str(e), value=e.value,
        retryable=getattr(e, "retryable", True) if cls == "StorageError" else None,
        expected=getattr(e, "expected", None), current=getattr(e, "current", None),
    )


def record_of(e: BaseException) -> ErrorRecord:
    """The record of ``e``: a ShardsinkError (also one carried from an executor), else UnexpectedError."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:  # the library may wrap: walk the causes
        seen.add(id(cur))
        if isinstance(cur, E.ShardsinkError):
            return _of_shardsink(cur)
        cur = cur.__cause__ or cur.__context__
    carried = _find_mark(str(e))
    if carried is not None:
        return carried
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return ErrorRecord(error_class="UnexpectedError", raised=type(e).__name__, message=first[:2000])


def _find_mark(text: str) -> ErrorRecord | None:
    at = text.rfind(MARK)
    if at < 0:
        return None
    try:  # the record is one JSON object; Spark may append text after it (e.g. " SQLSTATE: P0001")
        obj, _ = json.JSONDecoder().raw_decode(text, at + len(MARK))
        return msgspec.convert(obj, ErrorRecord)
    except (ValueError, msgspec.ValidationError):
        return None


def error_from_record(r: ErrorRecord) -> E.ShardsinkError | None:
    """The :mod:`shardsink.errors` instance a record stands for (None for UnexpectedError)."""
    if r.error_class == "UnexpectedError":
        return None
    msg = r.message if r.raised == r.error_class else f"{r.raised}: {r.message}"
    err: E.ShardsinkError
    if r.error_class == "UpperMismatchError":
        err = E.UpperMismatchError(msg, expected=r.expected if r.expected is not None else -1, current=r.current)
    elif r.error_class == "StorageError":
        err = E.StorageError(msg, retryable=r.retryable is not False)
    else:
        err = CLASSES[r.error_class](msg)
    err.value = r.value
    return err


class CarriedError(RuntimeError):
    """A ShardsinkError raised on an executor, as text Spark carries to the driver (module doc)."""


F = TypeVar("F", bound=Callable[..., Iterator[Any]])


def carry_errors(fn: F) -> F:
    """Wrap an executor-side generator function so ShardsinkErrors reach the driver as records."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            yield from fn(*args, **kwargs)
        except E.ShardsinkError as e:
            # msgspec.json.encode, not a module-level Encoder: cloudpickle ships this closure
            # by value and an Encoder cannot be pickled.
            raise CarriedError(MARK + msgspec.json.encode(_of_shardsink(e)).decode()) from e

    return wrapped  # type: ignore[return-value]


def write_outcome(path: str | os.PathLike[str], outcome: JobOutcome) -> None:
    """Write ``outcome`` to ``path`` atomically (a reader never sees half a record)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".outcome-")
    with os.fdopen(fd, "wb") as f:
        f.write(_encoder.encode(outcome))
    os.replace(tmp, target)


def read_outcome(path: str | os.PathLike[str]) -> JobOutcome | None:
    """The record at ``path``, or None if the job wrote none (it died first) or it is unreadable."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _outcome.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
