"""The deferred waits of a sink run, run by Airflow's triggerer: its mint's
(:class:`EarlierIntervalsTrigger`) and an append minted ahead waiting its turn (:class:`TurnTrigger`).

A run whose earlier intervals are not covered yet waits for their runs instead of racing
them (:func:`shardsink.airflow.gates.wait_for_earlier_intervals`). It waits the way Airflow
3 intends: the mint task *defers* (state ``deferred``: no worker slot, no try consumed) and
this trigger, in the triggerer process, watches the shard's upper. It hands the task back
(the task runs again from the top and decides from its own read) when

* ``covered``: the upper reached ``interval_start`` (the earlier intervals are covered);
* ``catch_up``: neither the run's start nor the shard's last commit is within
  ``catch_up_after`` seconds (no progress: the run catches up itself);
* ``ready``: the shard was closed (the task's own checks say what that means);
* ``unreadable``: a read failed after the store's own retry policy (the task re-reads,
  under Airflow's task retries, instead of the trigger failing the task).

The rule is :func:`idle_seconds`, shared with the gate: the task and the trigger agree on
when waiting ends, whatever clock either reads first (time only moves forward).

The trigger carries plain values only (its kwargs are stored in Airflow's ``trigger``
table): the shard URL, times, durations and the name of an ``aws`` connection, never a
credential; the triggerer resolves the connection itself (:mod:`shardsink.airflow.credentials`),
so it needs the same shardsink package, the store's network and the connection's secrets
backend as a worker. Store reads are synchronous: each runs in a thread
(``asyncio.to_thread``), never on the triggerer's event loop. Between reads the trigger
awaits ``asyncio.sleep`` (the triggerer's loop runs other triggers meanwhile; nothing
blocks), at most ``poke_interval`` and never past the catch-up moment. A trigger appending a
turn's chain (:class:`TurnTrigger`) does so in such a thread too, and never sleeps there.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from shardsink import hooks
from shardsink.airflow.results import RESULTS_FORMAT, TurnCommit
from shardsink.core import checks as ck
from shardsink.core.read import ShardInfo
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import DESCRIPTION_FORMAT, decode, to_builtins

#: The operator method a deferred shardsink task resumes with (:class:`shardsink.provider.operators.ShardTaskOperator`).
RESUME_METHOD = "resume_after_wait"


def idle_seconds(info: ShardInfo, run_started: float | None, now: float) -> float:
    """Seconds since the latest sign of progress: the shard's last commit or the run's start (epoch s)."""
    marks = [datetime.fromisoformat(info.last_commit.at).timestamp()]
    if run_started is not None:
        marks.append(run_started)
    return now - max(marks)


def behind(info: ShardInfo, interval_start: int) -> bool:
    """Whether an earlier interval is not covered yet (an open shard whose upper is below ``interval_start``)."""
    return info.upper is not None and info.upper < interval_start


def _epoch_seconds(value: object, *, what: str) -> float:
    """``value`` as a moment in epoch seconds: a finite number whose milliseconds are a shard time."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidUsageError(f"{what} {value!r} is not a moment in epoch seconds", value=value)
    ck.check_time(int(value * 1000), what=f"{what} (as epoch milliseconds)")
    return float(value)


class _ShardPokeTrigger(BaseTrigger):
    """What both waits share: one shard (and the connection its store is reached with), one
    head read per poke in a thread, and a loop that hands the task back with the first payload
    :meth:`decide` returns, or ``unreadable`` when a read fails.

    SUBTLE: a failed read never fails the try from here: the task re-reads under its own retries.
    """

    #: The clock a poke decides by and the pause between pokes: the triggerer's (a test injects
    #: simulated ones on an instance; they are never serialized).
    clock: Callable[[], float] = staticmethod(time.time)
    pause: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)

    def __init__(self, *, shard_url: str, aws_conn_id: str | None) -> None:
        super().__init__()
        if not isinstance(shard_url, str) or not shard_url:
            raise InvalidUsageError(f"shard_url {shard_url!r} is not a shard URL", value=shard_url)
        if aws_conn_id is not None and (not isinstance(aws_conn_id, str) or not aws_conn_id):
            raise InvalidUsageError(f"aws_conn_id {aws_conn_id!r} is not a connection id", value=aws_conn_id)
        self.shard_url = shard_url
        self.aws_conn_id = aws_conn_id

    def _read(self) -> ShardInfo:
        """The shard's head (one read), with the connection's credentials if one is named. Runs in a thread."""
        from shardsink.airflow.credentials import store_access
        from shardsink.core.shard import Shard

        with store_access(self.aws_conn_id):
            info = Shard(self.shard_url).info()
        hooks.fire("trigger.poked", shard_url=self.shard_url, upper=info.upper)
        return info

    def decide(self, info: ShardInfo, now: float) -> dict[str, Any] | None:
        """The event's payload if waiting ends at ``now`` with the shard at ``info``, else None."""
        raise NotImplementedError

    def _unreadable(self) -> dict[str, Any]:
        """What an ``unreadable`` event carries besides the error."""
        return {}

    def _next_wait(self, info: ShardInfo, now: float) -> float:
        """Seconds until the next poke (at most ``poke_interval``)."""
        raise NotImplementedError

    async def _on_decided(self, info: ShardInfo, payload: dict[str, Any]) -> dict[str, Any]:
        """What the event carries once :meth:`decide` ended the wait (default: ``payload``)."""
        return payload

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                info = await asyncio.to_thread(self._read)
            except Exception as e:  # any failure (a missing connection too) hands the task back
                yield TriggerEvent({"status": "unreadable", "error": f"{type(e).__name__}: {str(e)[:300]}",
                                    **self._unreadable()})
                return
            now = self.clock()
            payload = self.decide(info, now)
            if payload is not None:
                payload = await self._on_decided(info, payload)
                self.log.info("shard %s: %s; handing the task back", self.shard_url, payload)
                yield TriggerEvent(payload)
                return
            await self.pause(max(0.0, self._next_wait(info, now)))


class EarlierIntervalsTrigger(_ShardPokeTrigger):
    """Fires once the shard at ``shard_url`` covers ``interval_start`` or has made no progress for
    ``catch_up_after`` seconds (module docstring); reads the shard's head every ``poke_interval``.

    Every argument is range-checked (a bad one raises InvalidUsageError naming it), in the task
    that defers and again where the triggerer rebuilds the trigger from its stored kwargs.
    """

    def __init__(self, *, shard_url: str, interval_start: int, catch_up_after: float, poke_interval: float,
                 run_started: float | None = None, aws_conn_id: str | None = None) -> None:
        super().__init__(shard_url=shard_url, aws_conn_id=aws_conn_id)
        self.interval_start = ck.check_time(interval_start, what="interval_start")
        self.catch_up_after = ck.check_seconds(catch_up_after, what="catch_up_after")
        self.poke_interval = ck.check_seconds(poke_interval, what="poke_interval", positive=True)
        self.run_started = None if run_started is None else _epoch_seconds(run_started, what="run_started")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"shard_url": self.shard_url, "interval_start": self.interval_start,
                 "catch_up_after": self.catch_up_after, "poke_interval": self.poke_interval,
                 "run_started": self.run_started, "aws_conn_id": self.aws_conn_id})

    def decide(self, info: ShardInfo, now: float) -> dict[str, Any] | None:
        """The event's payload if waiting ends at ``now`` with the shard at ``info``, else None."""
        if info.upper is None:
            return {"status": "ready", "reason": "the shard is closed", "upper": None}
        if not behind(info, self.interval_start):
            return {"status": "covered", "upper": info.upper, "interval_start": self.interval_start}
        idle = idle_seconds(info, self.run_started, now)
        if idle >= self.catch_up_after:
            return {"status": "catch_up", "upper": info.upper, "interval_start": self.interval_start,
                    "idle_s": round(idle, 3), "last_commit_at": info.last_commit.at}
        return None

    def _next_wait(self, info: ShardInfo, now: float) -> float:
        return min(self.poke_interval, self.catch_up_after - idle_seconds(info, self.run_started, now))


class TurnTrigger(_ShardPokeTrigger):
    """Fires once an append minted ahead may go on: the shard's upper reached ``lower`` (its
    description's), or the wait is over. Reads the shard's head every ``poke_interval`` (one read
    per poke, in a thread). Events (each carries ``waiting_since``, so a re-deferred wait keeps
    counting from its start):

    * ``reached``: the upper is at or past ``lower`` (the task settles its fate from its own read);
    * ``ready``: the shard was closed;
    * ``timeout``: ``deadline`` (epoch s: the wait's start plus ``max_append_wait``) passed;
    * ``idle``: ``catch_up_after`` is given and neither the wait's start nor the shard's last
      commit is within it (the task then looks who, if anyone, it waits behind);
    * ``unreadable``: a read failed after the store's own retry policy.

    ``commit`` (a :class:`~shardsink.airflow.results.TurnCommit` as plain values): when the upper
    is exactly ``lower``, the trigger appends the chain itself before handing back, through the
    task's own call (:func:`shardsink.sinks.append.append_run`, in a thread, with the run's
    writer; its retries never sleep on the shared pool). The next interval's turn then comes one
    head read later, not after this task has come back through the scheduler and a worker. The
    event says nothing of it: the task resumes, calls the same operation, and the shard log's
    writer tells it this run made the commits.

    SUBTLE: the trigger commits while its task is deferred, so a twin of the task, a second
    triggerer picking the trigger up, or the task resumed after a lost event may append the
    same chain: each is a conditional put on the same lower, so one commits and the others
    find it committed (the fate primitive keeps the batch). Any error stops the trigger's
    commits (an unknown outcome included, or a retry that would wait): it is logged and the
    task settles the fate.
    Cancelled (the task cleared, marked failed or succeeded while deferred: :meth:`on_kill`, or
    the trigger removed), it starts no further commit; a conditional put already sent may
    still land, as a killed task's may, and the description's fate says so.
    """

    def __init__(self, *, shard_url: str, lower: int, poke_interval: float, waiting_since: float, deadline: float,
                 catch_up_after: float | None = None, behind: str | None = None,
                 aws_conn_id: str | None = None, commit: dict[str, Any] | None = None) -> None:
        if behind is not None and not isinstance(behind, str):
            raise InvalidUsageError(f"behind {behind!r} is not a description line", value=repr(behind)[:80])
        super().__init__(shard_url=shard_url, aws_conn_id=aws_conn_id)
        self.lower = ck.check_time(lower, what="lower")
        self.poke_interval = ck.check_seconds(poke_interval, what="poke_interval", positive=True)
        self.waiting_since = _epoch_seconds(waiting_since, what="waiting_since")
        self.deadline = _epoch_seconds(deadline, what="deadline")
        if self.deadline < self.waiting_since:
            raise InvalidUsageError(f"deadline {deadline!r} is before waiting_since {waiting_since!r}", value=deadline)
        self.catch_up_after = None if catch_up_after is None else ck.check_seconds(catch_up_after,
                                                                                   what="catch_up_after")
        self.behind = None if behind is None else behind[:500]
        self.commit = None if commit is None else _turn_commit(commit, self.lower)
        self._stopped = threading.Event()  # set once cancelled: no further commit starts

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"shard_url": self.shard_url, "lower": self.lower, "poke_interval": self.poke_interval,
                 "waiting_since": self.waiting_since, "deadline": self.deadline,
                 "catch_up_after": self.catch_up_after, "behind": self.behind, "aws_conn_id": self.aws_conn_id,
                 "commit": None if self.commit is None else to_builtins(self.commit)})

    def decide(self, info: ShardInfo, now: float) -> dict[str, Any] | None:
        """The event's payload if waiting ends at ``now`` with the shard at ``info``, else None."""
        base = {"lower": self.lower, "upper": info.upper, "waiting_since": self.waiting_since, "behind": self.behind}
        if info.upper is None:
            return {"status": "ready", "reason": "the shard is closed", **base}
        if info.upper >= self.lower:
            return {"status": "reached", **base}
        if now >= self.deadline:
            return {"status": "timeout", **base}
        if self.catch_up_after is not None:
            idle = idle_seconds(info, self.waiting_since, now)
            if idle >= self.catch_up_after:
                return {"status": "idle", "idle_s": round(idle, 3), "last_commit_at": info.last_commit.at, **base}
        return None

    def _unreadable(self) -> dict[str, Any]:
        return {"lower": self.lower, "waiting_since": self.waiting_since, "behind": self.behind}

    def _next_wait(self, info: ShardInfo, now: float) -> float:
        return min(self.poke_interval, self.deadline - now)

    async def on_kill(self) -> None:
        self._stopped.set()

    async def cleanup(self) -> None:
        self._stopped.set()
        await super().cleanup()

    async def _on_decided(self, info: ShardInfo, payload: dict[str, Any]) -> dict[str, Any]:
        if self.commit is not None and payload.get("status") == "reached" and info.upper == self.lower:
            try:
                await asyncio.to_thread(self._commit, self.commit)
            except asyncio.CancelledError:  # the thread runs on: it starts no further commit
                self._stopped.set()
                raise
        return payload

    def _commit(self, commit: TurnCommit) -> None:
        """Append ``commit``'s chain as the task would (:func:`shardsink.sinks.append.append_run`);
        never raises, never sleeps: its store handle's retries refuse to wait (the thread is the
        triggerer's shared pool), so a transient error ends the attempt and the task settles the
        fate from its own read. Runs in a thread."""
        from shardsink.airflow.credentials import store_access
        from shardsink.core.shard import Shard
        from shardsink.sinks.append import Appended, append_run

        if self._stopped.is_set():
            self.log.info("cancelled before committing; the task settles the chain")
            return
        try:
            with store_access(self.aws_conn_id):
                out = append_run(Shard(self.shard_url, sleep=_refuse_to_wait), commit.chain, commit.slots,
                                 writer=commit.writer)
        except Exception as e:  # the outcome may be unknown: the task re-reads and settles it
            self.log.warning("stopped committing on the triggerer: %s: %s", type(e).__name__, e)
            return
        for x in out.landed if isinstance(out, Appended) else ():
            self.log.info("committed description %s [%d, %d) at seqno %d on the triggerer", x.desc.desc_id,
                          x.result.lower, x.result.upper, x.result.seqno)
        if not isinstance(out, Appended):
            self.log.info("committed nothing on the triggerer (%s); the task settles the chain", type(out).__name__)


class _WouldWait(Exception):
    """A retry on the triggerer would have slept in the pool every trigger shares."""


def _refuse_to_wait(seconds: float) -> None:
    raise _WouldWait(f"a retry would wait {seconds:.3f}s on the triggerer's shared thread pool; left to the task")


def _turn_commit(value: object, lower: int) -> TurnCommit:
    """``value`` decoded as a :class:`TurnCommit`: a contiguous chain of descriptions (each of a
    format this shardsink reads) starting at ``lower``, slots and writer as the core checks them."""
    got = decode(value, TurnCommit, what="TurnTrigger commit", newest=RESULTS_FORMAT)
    bounds = [(d.lower, d.upper) for d in got.chain]
    if (not bounds or bounds[0][0] != lower or any(lo >= up for lo, up in bounds)
            or any(a[1] != b[0] for a, b in itertools.pairwise(bounds))):
        raise InvalidUsageError(f"TurnTrigger commit chain {bounds[:4]} is not contiguous from lower {lower}",
                                value=repr(bounds)[:200])
    newer = [d.format for d in got.chain if d.format > DESCRIPTION_FORMAT]
    if newer:
        raise InvalidUsageError(f"TurnTrigger commit has a description of format {newer[0]}; this shardsink reads "
                                f"1..{DESCRIPTION_FORMAT} (upgrade the triggerer with the workers)", value=newer[0])
    ck.check_count(got.slots, what="TurnTrigger commit slots", lo=1)
    ck.check_writer(got.writer)
    return got
