"""What the sink steps pass around: a description (one attempt's batch) and the "nothing to do" result.

Contract: a :class:`Description` names one attempt's batch ``[lower, upper)`` by a
``desc_id`` unique per call of :func:`make_desc_id` (a fresh id after every lost race, so
a staging prefix never mixes two descriptions). Mint steps return :class:`NoOp` instead
when ``upper <= lower``.

Both are msgspec structs with a ``format`` version: they cross process boundaries (Airflow
XCom) as plain JSON values, :func:`to_builtins` one way and :func:`decode` the other, ONE
typed decode at each consumer. A value without ``format`` (pushed before it carried one)
is format 1; unknown fields are ignored (a newer writer may add some); a newer format, a
missing or mistyped field is an :class:`InvalidUsageError` naming the value and the field.
"""

from __future__ import annotations

import re
import uuid
import warnings
from typing import Any, TypeVar

import msgspec

from shardsink.core.commits import Listing
from shardsink.errors import InvalidUsageError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")

#: Format of a description as it travels: readers accept this or older and ignore unknown fields.
DESCRIPTION_FORMAT = 1

S = TypeVar("S")


def to_builtins(value: msgspec.Struct | list[Any] | tuple[Any, ...]) -> Any:
    """``value`` as plain JSON values (dicts, lists, str, int, float, bool, None): what XCom carries."""
    return msgspec.json.decode(msgspec.json.encode(value))


def decode(value: Any, kind: type[S], *, what: str, newest: int = DESCRIPTION_FORMAT) -> S:
    """``value`` (plain JSON values, e.g. an XCom) as ``kind``: the one typed decode of a consumer.

    InvalidUsageError naming ``what`` and the offending field (``$.lower``, ``$[1].upper``) if
    a field is missing or mistyped, or if an object's ``format`` is newer than ``newest``.
    """
    for obj in value if isinstance(value, list | tuple) else (value,):
        fmt = obj.get("format") if isinstance(obj, dict) else None
        if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > newest:
            raise InvalidUsageError(
                f"{what} has format {fmt}; this shardsink reads formats 1..{newest} (a newer shardsink wrote it: "
                "upgrade every worker)", value=str(fmt))
    try:
        return msgspec.convert(value, type=kind)
    except msgspec.ValidationError as e:
        raise InvalidUsageError(f"{what} is malformed: {e}") from e


class Description(msgspec.Struct, frozen=True):
    """One attempt's batch ``[lower, upper)`` named ``desc_id``; what XCom carries."""

    desc_id: str
    lower: int
    upper: int
    attempt: int
    #: A re-processing description also carries the correction of the sealed range
    #: ``[corrects[0], corrects[1])`` (see :mod:`shardsink.sinks.reprocess`); None otherwise.
    corrects: tuple[int, int] | None = None
    format: int = DESCRIPTION_FORMAT
    #: The source listing that fixed the description's input (a landing zone's mint: its file
    #: plan was made from it), recorded on its commit: it seals its times as of this listing.
    #: None: a source without plans (sealed as of the commit).
    listing: Listing | None = None

    @classmethod
    def decode(cls, value: Any, *, what: str = "description") -> Description:
        """A description from its plain values (an XCom, a templated operator argument)."""
        return decode(value, cls, what=what)

    def to_dict(self) -> dict[str, Any]:
        """Deprecated (one release): use :func:`to_builtins`."""
        warnings.warn("Description.to_dict() is deprecated; use shardsink.sinks.description.to_builtins(desc)",
                      DeprecationWarning, stacklevel=2)
        out: dict[str, Any] = to_builtins(self)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Description:
        """Deprecated (one release): use :meth:`decode`."""
        warnings.warn("Description.from_dict() is deprecated; use Description.decode(value)", DeprecationWarning,
                      stacklevel=2)
        return cls.decode(d)


def descriptions(value: Any, *, what: str = "descriptions") -> list[Description]:
    """A mint's XCom (a list of descriptions) decoded once, typed."""
    return decode(value, list[Description], what=what)


class NoOp(msgspec.Struct, frozen=True):
    """Nothing to write: ``upper <= lower``. ``reason`` is the log line operators see."""

    reason: str
    shard_upper: int | None
    watermark: int | None
    interval_end: int | None
    format: int = DESCRIPTION_FORMAT


def make_desc_id(dag_id: str, run_id: str, attempt: int) -> str:
    """``<dag>-<run slug>-a<k>-<8 hex>``: unique per call, valid as a key segment (<= 128 chars)."""
    dag = _UNSAFE.sub("-", dag_id).strip("-.")[:40] or "dag"
    run = _UNSAFE.sub("-", run_id).strip("-.")[:60] or "run"
    return f"{dag}-{run}-a{attempt}-{uuid.uuid4().hex[:8]}"


_DESC_TAIL = re.compile(r"(.+)-a[0-9]+-[0-9a-f]{8}")
"""The tail :func:`make_desc_id` appends after the run slug: ``-a<attempt>-<8 hex>`` (the hex may
itself start with ``a``, so the slug ends where this whole tail begins, not at the last ``-a``)."""


def run_of(desc_id: str, dag_id: str) -> str | None:
    """The DAG run slug a description id minted by :func:`make_desc_id` for ``dag_id`` names (the
    run id with unsafe characters replaced, at most 60 of them); None if the id is not that DAG's."""
    dag = _UNSAFE.sub("-", dag_id).strip("-.")[:40] or "dag"
    if not desc_id.startswith(f"{dag}-"):
        return None
    m = _DESC_TAIL.fullmatch(desc_id[len(dag) + 1:])
    return m.group(1) if m else None
