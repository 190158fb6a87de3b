"""What the tasks of a sink DAG run leave in XCom besides the descriptions: msgspec structs
with a ``format`` version, pushed as plain JSON values and decoded once, typed, by each
consumer (:func:`shardsink.sinks.description.decode`).

* :class:`MintTarget` (key ``target`` of ``attempt_<k>.mint``; ``plan`` before it was named so):
  the run's target as that mint saw it;
* :class:`AppendReport` (``return_value`` of ``attempt_<k>.append``): what the attempt
  committed (:class:`CommittedRange`), the descriptions it found lost, the shard's upper;
* :class:`RunReport` (``return_value`` of ``report``): every range the run committed;
* :class:`TurnCommit` (a :class:`shardsink.airflow.triggers.TurnTrigger`'s stored kwargs): what
  an append minted ahead lets its trigger append when the turn comes.

The keys are the documented ones (``committed = [{desc_id, lower, upper, seqno, rows,
status, corrects}]``, ``target``, ``upper``, ``writer``), plus ``format``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from shardsink.sinks.description import Description

#: Format of the XCom results: readers accept this or older and ignore unknown fields.
RESULTS_FORMAT = 1


class MintTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What a mint aimed at: the run's target ``min(interval end, watermark)`` (None: no watermark yet),
    the watermark and interval end it came from, the range it re-processes, whether it is a dry run."""

    format: int = RESULTS_FORMAT
    target: int | None = None
    watermark: int | None = None
    interval_end: int | None = None
    corrects: tuple[int, int] | None = None
    dry_run: bool = False


class CommittedRange(msgspec.Struct, frozen=True, kw_only=True):
    """One description the run committed (or found committed by a twin: ``already_committed``)."""

    desc_id: str
    lower: int
    upper: int | None
    seqno: int
    rows: int
    status: Literal["committed", "already_committed"]
    corrects: tuple[int, int] | None = None


class AppendReport(msgspec.Struct, frozen=True, kw_only=True):
    """An attempt's append: its commits in order, why the others were lost, the shard's upper as
    last seen, and (after a loss) when the next attempt may mint (epoch seconds)."""

    format: int = RESULTS_FORMAT
    shard: str
    committed: tuple[CommittedRange, ...] = ()
    lost: tuple[str, ...] = ()
    upper: int | None = None
    retry_at: float | None = None
    #: The timeline (epoch s): the mint, the writes done (the append's first start), the commit;
    #: ``waited_for``: the description (and run) a description minted ahead waited behind.
    minted_at: float | None = None
    staged_at: float | None = None
    waited_for: str | None = None
    committed_at: float | None = None
    #: The attempt gave its turn up (its descriptions, minted ahead, were left StillPossible: a
    #: later attempt of the run deletes what they staged once its commits pass them).
    gave_up: bool = False


class RunReport(msgspec.Struct, frozen=True, kw_only=True):
    """The run's account (the ``report`` task): its commits, its target and the shard's upper."""

    format: int = RESULTS_FORMAT
    shard: str
    run_id: str
    writer: str
    committed: tuple[CommittedRange, ...] = ()
    target: int | None = None
    upper: int | None = None
    #: A dry run's totals (:func:`shardsink.spark.dryrun.totals`); None for a real run.
    dry_run: dict[str, Any] | None = None


class TurnCommit(msgspec.Struct, frozen=True, kw_only=True):
    """What an append waiting its turn lets its trigger append once the shard's upper equals the
    chain's first lower (:func:`shardsink.sinks.append.append_run`, as the task would): the
    attempt's chain in order, the write slots of each description (a correcting one has one) and
    the writer its commits carry (the run's: the shard log then says this run committed them)."""

    format: int = RESULTS_FORMAT
    chain: tuple[Description, ...]
    slots: int
    writer: str
