"""What the sink steps pass around: a description (one attempt's batch) and the "nothing to do" result.

Contract: a :class:`Description` names one attempt's batch ``[lower, upper)`` by a
``desc_id`` unique per call of :func:`make_desc_id` (a fresh id after every lost race, so
a staging prefix never mixes two descriptions); it travels as a plain dict
(:meth:`Description.to_dict`, XCom and command-line arguments) and back. Mint steps
return :class:`NoOp` instead when ``upper <= lower``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")


@dataclass(frozen=True)
class Description:
    """One attempt's batch ``[lower, upper)`` named ``desc_id``; what XCom carries."""

    desc_id: str
    lower: int
    upper: int
    attempt: int
    #: A re-processing description also carries the correction of the sealed range
    #: ``[corrects[0], corrects[1])`` (see :mod:`shardsink.sinks.reprocess`); None otherwise.
    corrects: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["corrects"] = list(self.corrects) if self.corrects is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Description:
        c = d.get("corrects")
        return cls(str(d["desc_id"]), int(d["lower"]), int(d["upper"]), int(d["attempt"]),
                   (int(c[0]), int(c[1])) if c else None)


@dataclass(frozen=True)
class NoOp:
    """Nothing to write: ``upper <= lower``. ``reason`` is the log line operators see."""

    reason: str
    shard_upper: int | None
    watermark: int | None
    interval_end: int | None


def make_desc_id(dag_id: str, run_id: str, attempt: int) -> str:
    """``<dag>-<run slug>-a<k>-<8 hex>``: unique per call, valid as a key segment (<= 128 chars)."""
    dag = _UNSAFE.sub("-", dag_id).strip("-.")[:40] or "dag"
    run = _UNSAFE.sub("-", run_id).strip("-.")[:60] or "run"
    return f"{dag}-{run}-a{attempt}-{uuid.uuid4().hex[:8]}"
