"""Ingest DAG runs as Airflow runs them: attempts of mint → write slots → append, as actors.

A :class:`Run` owns one DAG run's interval ``[lo, hi)``. Each attempt is three kinds of task, each
an actor running the library's own driver steps: the mint (:func:`shardsink.sinks.ingest.mint_chain`,
minting ahead of the upper as the DAG's attempt 1 does when the source covers its interval), one
write task per description and slot (the source's slot writer, :mod:`shardsink_dev.sim.sources`),
and the append (:func:`shardsink.sinks.append.append_run`, with its turn's clock simulated).
Like Airflow, a task whose try crashed or raised a retryable error is tried again after a backoff
(``Plan.retries``), and a try may have a *twin* (the zombie of a try Airflow gave up on, still
running beside its retry). The append's outcome is mapped as the DAG's append task maps it:
Waiting defers (the task is tried again at its trigger's next poke, idle once nothing moved for
``catch_up_after``), Lost starts the next attempt (at once when it gave its turn up, naming the
chain superseded), Failed ends the run, Appended records what landed (and, short of the run's
target, starts the next attempt).

What the ledger learns here is the model's input: every minted description (and its run), every
description an append was attempted for (ambiguous until acknowledged), every acknowledged one.
One invariant is checked here, when a wait names who it waits behind: each description it names
belongs to the DAG run it names (:func:`shardsink.sinks.description.run_of`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol

from shardsink.sinks.append import Appended, Failed, Lost, Turn, Waiting, append_run
from shardsink.sinks.description import Description, NoOp
from shardsink.sinks.ingest import Seen, mint_chain, read_watermark
from shardsink_dev.sim.ctx import DAG, Sim, judge
from shardsink_dev.sim.sched import Actor

_BEHIND = re.compile(r"description (\S+) \[\d+, \d+\) of DAG run '([^']*)'")
#: Backoffs (simulated seconds): a task's retry, an attempt after a loss, a deferred append's poke.
RETRY_S, ATTEMPT_S, POKE_S = 30.0, 60.0, 20.0
#: How much later than its try a twin may run (simulated seconds).
TWIN_LAG = (0.0, 3.0, 15.0)


class SlotWriter(Protocol):
    """A source's write task for one description and slot (:mod:`shardsink_dev.sim.sources`)."""

    #: What the mint reads (a :class:`shardsink.sources.base.Source` as far as the mint uses one: its
    #: watermark, and ``prepare_chain`` for the landing zone).
    source: Any

    def write(self, sim: Sim, desc: Description, slot: int, slots: int) -> None: ...


class Run:
    """One DAG run (see the module docstring)."""

    def __init__(self, sim: Sim, idx: int, writer: SlotWriter) -> None:
        self.sim, self.idx, self.writer = sim, idx, writer
        self.run_id = f"scheduled__2026-01-{idx + 1:02d}"
        self.lo, self.hi = idx * sim.plan.interval, (idx + 1) * sim.plan.interval
        self.attempt = 0
        self.chain: list[Description] = []
        self.superseded: list[Description] = []
        self.target: int | None = None
        self.wait_since: float | None = None
        self.progress: tuple[int | None, float] | None = None  # the upper a wait last saw, and when it moved

    @property
    def name(self) -> str:
        return f"run{self.idx}.a{self.attempt}"

    def start(self, delay: float) -> None:
        self._next_attempt(delay)

    def _next_attempt(self, delay: float) -> None:
        self.attempt += 1
        self.wait_since, self.chain, self.progress = None, [], None
        if self.attempt > self.sim.plan.attempts:
            self.sim.ledger.outcomes.append(f"run {self.idx}: no attempt left")
            return
        self._task("mint", self._mint, self._minted, delay)

    def _task(self, name: str, body: Callable[[], Any], on_ok: Callable[[Any], None], delay: float,
              tries: int = 1) -> None:
        """A task try (and maybe its twin); retried like Airflow retries it. A try of an attempt the
        run left behind (its result is nobody's XCom any more) is only judged."""
        sim, who, attempt = self.sim, f"{self.name}.{name}", self.attempt

        def end(a: Actor) -> None:
            verdict = judge(sim, a.name, a.error)
            if attempt != self.attempt:
                return
            if verdict == "ok":
                on_ok(a.result)
            elif verdict == "retry" and tries <= sim.plan.retries:
                self._task(name, body, on_ok, RETRY_S, tries + 1)
            else:
                sim.ledger.outcomes.append(f"{a.name}: failed for good")

        def twin_end(a: Actor) -> None:
            judge(sim, a.name, a.error)  # its result is nobody's, but it may not break anything

        sim.sched.spawn(f"{who}#{tries}", body, delay=delay, on_end=end)
        if sim.tape.chance(sim.plan.twins):  # a zombie try, still running (or starting late) beside this one
            sim.sched.spawn(f"{who}#{tries}-twin", body, delay=delay + sim.tape.pick(TWIN_LAG), on_end=twin_end)

    # --- mint -----------------------------------------------------------------------------

    def _mint(self) -> list[Description] | NoOp:
        sim = self.sim
        shard = sim.shard()
        info = shard.info()
        wm = read_watermark(self.writer.source)
        ahead = None
        if sim.plan.ahead and self.attempt == 1 and info.upper is not None and info.upper < self.lo \
                and wm is not None and wm >= self.hi:
            ahead = self.lo
        self.target = None if wm is None else min(wm, self.hi)
        return mint_chain(shard, self.writer.source, interval_end=self.hi, max_span=sim.plan.max_span,
                          max_chain=sim.plan.max_chain, dag_id=DAG, run_id=self.run_id, attempt=self.attempt,
                          seen=Seen(info, wm), ahead_from=ahead)

    def _minted(self, out: list[Description] | NoOp) -> None:
        led = self.sim.ledger
        if isinstance(out, NoOp):
            led.outcomes.append(f"{self.name}: nothing to do")
            return
        self.chain = list(out)
        slug = self.run_id  # already a safe slug (no characters make_desc_id replaces)
        for d in out:
            led.minted[d.desc_id], led.run_of[d.desc_id] = d, slug
            self.sim.checker.lowers[d.desc_id] = d.lower
        pending = {(d.desc_id, s) for d in out for s in range(self.sim.plan.slots)}
        for d in out:
            for s in range(self.sim.plan.slots):
                self._task(f"write-{d.desc_id[-4:]}-{s}", self._writes(d, s), self._wrote(pending, (d.desc_id, s)), 0.0)

    # --- writes -----------------------------------------------------------------------------

    def _writes(self, d: Description, slot: int) -> Callable[[], None]:
        return lambda: self.writer.write(self.sim, d, slot, self.sim.plan.slots)

    def _wrote(self, pending: set[tuple[str, int]], what: tuple[str, int]) -> Callable[[Any], None]:
        attempt = self.attempt

        def ok(_: Any) -> None:
            if attempt != self.attempt or what not in pending:
                return
            pending.discard(what)
            if not pending:
                self._task("append", self._appender(), self._appended, 0.0)
        return ok

    # --- append -------------------------------------------------------------------------------

    def _appender(self) -> Callable[[], Any]:
        """The append task of this attempt: its chain and the chains it supersedes, as its XCom holds them."""
        sim, chain, superseded = self.sim, list(self.chain), list(self.superseded)
        since, progress = self.wait_since, self.progress

        def append() -> Any:
            now = sim.now()
            idle = progress is not None and now - progress[1] >= sim.plan.catch_up_after
            turn = Turn(since=since if since is not None else now, max_wait=sim.plan.max_wait,
                        catch_up_after=sim.plan.catch_up_after, idle=idle, dag_id=DAG, now=sim.now)
            sim.ledger.attempted.update(d.desc_id for d in chain)
            return append_run(sim.shard(), chain, sim.plan.slots, writer=f"airflow:{DAG}/{self.run_id}",
                              turn=turn, superseded=superseded)
        return append

    def _appended(self, out: Any) -> None:
        led = self.sim.ledger
        if isinstance(out, Waiting):
            self._check_behind(out.behind)
            if self.wait_since is None:
                self.wait_since = out.since
            if self.progress is None or out.upper != self.progress[0]:
                self.progress = (out.upper, self.sim.now())
            self._task("append", self._appender(), self._appended, POKE_S)
        elif isinstance(out, Lost):
            if out.gave_up:
                self.superseded += self.chain
            self._next_attempt(0.0 if out.gave_up else ATTEMPT_S)
        elif isinstance(out, Failed):
            waited = self.sim.now() - self.wait_since if self.wait_since is not None else 0.0
            if waited < self.sim.plan.max_wait:  # the one cause in a simulation: a wait past max_append_wait
                raise self.sim.violation("append-failed", f"{self.name}: {out.why[:300]}")
            led.outcomes.append(f"{self.name}: append failed: {out.why[:160]}")
        else:
            assert isinstance(out, Appended)
            led.acked.update(x.desc.desc_id for x in out.landed)
            up = out.upper
            if self.target is not None and up is not None and up < self.target:
                self._next_attempt(ATTEMPT_S)

    def _check_behind(self, behind: str) -> None:
        for desc_id, run in _BEHIND.findall(behind):
            owner = self.sim.ledger.run_of.get(desc_id)
            if owner is not None and owner != run:
                raise self.sim.violation("waits-behind-wrong-run", f"{self.name} waits behind {desc_id} of DAG run "
                                                                   f"{run!r}, but run {owner!r} minted it")

