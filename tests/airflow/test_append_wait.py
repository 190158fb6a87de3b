"""Issue 34, the Airflow side: a run whose interval starts past the shard's upper mints ahead (its
own interval, at once, when the source covers it), and its append waits its turn DEFERRED to a
:class:`TurnTrigger` (no worker slot, one head read per poke); past ``max_append_wait`` it fails
naming the description and run it waits behind; with nobody working at the upper it gives its
turn up (the next attempt catches up). Real local shards, a real ``@shard_task`` operator, and the
trigger's ``run()`` for real in asyncio. The library guarantees (StillPossible, GC, verify, killed
appends in processes) are in tests/sinks/test_ahead_appends.py.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred
from support import SCHEMA, rows_for, table_of

from shardsink import Shard, hooks
from shardsink.airflow.gates import ahead_from
from shardsink.airflow.options import AttemptOptions
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.tasks import given_up
from shardsink.airflow.triggers import RESUME_METHOD, EarlierIntervalsTrigger, TurnTrigger
from shardsink.core.fate import CannotCommit, StillPossible
from shardsink.errors import InvalidUsageError
from shardsink.provider.operators import shard_task
from shardsink.sinks.description import Description, make_desc_id, to_builtins
from shardsink.sinks.staging import write_manifest

DAY_MS = 86_400_000


def _ms(y: int, m: int, d: int) -> int:
    return int(datetime(y, m, d, tzinfo=UTC).timestamp() * 1000)


def _settings(url: str, **kw: Any) -> IngestSettings:
    args: dict[str, Any] = {"dag_id": "d", "shard_url": url, "source_spec": {}, "writers": 1, "max_span": None,
                            "max_attempts": 3, "initial_upper": 0, "catch_up_after": 300, "poke_interval": 7.0}
    return IngestSettings(**{**args, **kw})


def _context(url: str, role: str = "append") -> dict[str, Any]:
    with DAG("ahead", schedule=None):
        @shard_task(task_id=role, shard_role=role, shard_url=url)
        def body() -> None:
            return None

        op = body().operator
    pushed: dict[str, Any] = {}
    return {"task": op, "pushed": pushed,
            "dag_run": SimpleNamespace(start_date=datetime.now(UTC), run_id="backfill__2025-03-02", conf={},
                                       dag_id="d"),
            "ti": SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value),
                                  xcom_pull=lambda task_ids, key="return_value": None)}


def _resume(context: dict[str, Any], event: dict[str, Any]) -> None:
    """As the triggerer hands the task back: ``resume_after_wait`` keeps the event."""
    context["task"].execute = lambda ctx: None
    getattr(context["task"], RESUME_METHOD)({}, event)


def _stage(shard: Shard, d: Description) -> None:
    staged = shard.stage(table_of(rows_for(d.desc_id, d.lower, d.upper)), lower=d.lower, upper=d.upper,
                         desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=1, parts=staged.parts)


def test_a_run_past_the_upper_mints_its_own_interval_at_once_when_the_source_covers_it(tmp_path: Path) -> None:
    from shardsink.airflow.tasks import mint_task
    from shardsink.sources import LandingSource
    from shardsink_dev.synthetic import publish_watermark

    landing = tmp_path / "landing"
    landing.mkdir()
    publish_watermark(str(landing), _ms(2025, 3, 3))
    url = (tmp_path / "shard").as_uri()
    settings = _settings(url, source_spec=LandingSource(str(landing)).spec(), max_span=DAY_MS,
                         initial_upper=_ms(2025, 3, 1))
    Shard.create(url, SCHEMA, upper=settings.initial_upper)
    context = _context(url, "mint")
    context.update(params={}, data_interval_start=datetime(2025, 3, 2, tzinfo=UTC),
                   data_interval_end=datetime(2025, 3, 3, tzinfo=UTC))
    out = [Description.decode(d) for d in mint_task(settings, 1, context)]
    assert [(d.lower, d.upper) for d in out] == [(_ms(2025, 3, 2), _ms(2025, 3, 3))]  # no wait, no gap minted
    assert isinstance(context["pushed"]["minted_at"], float)
    assert Shard(url).info().upper == _ms(2025, 3, 1)  # minting commits nothing
    # A later attempt follows a loss or a turn given up: it never mints ahead, it waits (then catches up).
    with pytest.raises(TaskDeferred) as d:
        mint_task(settings, 2, context)
    assert isinstance(d.value.trigger, EarlierIntervalsTrigger)


def test_ahead_only_where_the_source_covers_the_interval_and_nothing_lands_at_the_upper(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=100)
    info, run = shard.info(), (200, 300)
    assert ahead_from(info, run, watermark=300, attempt=1, corrects=None, dry_run=False, reclocked=False) == 200
    assert ahead_from(info, run, watermark=299, attempt=1, corrects=None, dry_run=False, reclocked=False) is None
    assert ahead_from(info, (100, 300), watermark=300, attempt=1, corrects=None, dry_run=False,
                      reclocked=False) is None  # caught up: today's mint, from the upper
    for kw in ({"attempt": 2}, {"corrects": (0, 50)}, {"dry_run": True}, {"reclocked": True},
               {"catch_up_after": 0}):
        args: dict[str, Any] = {"watermark": 300, "attempt": 1, "corrects": None, "dry_run": False,
                                "reclocked": False, **kw}
        assert ahead_from(info, run, **args) is None, kw


def _append(settings: IngestSettings, context: dict[str, Any], chain: list[Description], attempt: int = 1
            ) -> dict[str, Any]:
    from shardsink.airflow.tasks import append_task

    context.setdefault("outlet_events", {"asset": SimpleNamespace(extra=None)})
    out: dict[str, Any] = append_task(settings, attempt, [to_builtins(d) for d in chain], context, "asset")
    return out


def _after_first_poke(action: Any) -> Any:
    """Run ``action`` once, in the trigger's thread, right after its first head read (a hook, not a sleep)."""
    done: list[bool] = []

    def hook(**_: Any) -> None:
        if not done:
            done.append(True)
            action()

    return hooks.register("trigger.poked", hook)


def test_an_ahead_append_defers_its_turn_and_names_who_it_waits_behind(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    settings = _settings(shard.url)
    earlier = Description(make_desc_id("d", "backfill__2025-03-01", 1), 0, 10, 1)
    _stage(shard, earlier)
    mine = Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1)
    _stage(shard, mine)
    context = _context(shard.url)
    with pytest.raises(TaskDeferred) as d:
        _append(settings, context, [mine])
    trigger = d.value.trigger
    assert isinstance(trigger, TurnTrigger) and d.value.method_name == RESUME_METHOD
    kw = trigger.serialize()[1]
    assert kw["lower"] == 10 and kw["catch_up_after"] == 300 and kw["deadline"] == kw["waiting_since"] + 86400
    assert f"description {earlier.desc_id} [0, 10) of DAG run 'backfill__2025-03-01' (d)" in kw["behind"]
    assert context["pushed"]["waiting"]["behind"] == kw["behind"]
    assert isinstance(shard.fate(mine.desc_id, mine.lower), StillPossible)  # nothing appended, nothing deleted
    # Its turn came (the triggerer says so; the task's own read decides): it commits, and the wait is reported.
    shard.append(table_of(rows_for("e", 0, 10)), lower=0, upper=10, desc_id=earlier.desc_id)
    _resume(context, {"status": "reached", "lower": 10, "upper": 10, "waiting_since": kw["waiting_since"],
                      "behind": kw["behind"]})
    out = _append(settings, context, [mine])
    assert [c["status"] for c in out["committed"]] == ["committed"] and out["upper"] == 20
    assert (out["staged_at"], out["waited_for"]) == (kw["waiting_since"], kw["behind"])


def test_a_wait_past_max_append_wait_fails_naming_the_description_and_run_behind(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    settings = _settings(shard.url, max_append_wait=60)
    stuck = Description(make_desc_id("d", "backfill__2025-03-01", 1), 0, 10, 1)
    _stage(shard, stuck)
    mine = Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1)
    _stage(shard, mine)
    context = _context(shard.url)
    _resume(context, {"status": "timeout", "lower": 10, "upper": 0, "waiting_since": time.time() - 61})
    with pytest.raises(AirflowFailException) as e:
        _append(settings, context, [mine])
    assert "max_append_wait 60s" in str(e.value) and stuck.desc_id in str(e.value)
    assert "'backfill__2025-03-01'" in str(e.value) and "Nothing was deleted" in str(e.value)
    assert isinstance(shard.fate(mine.desc_id, mine.lower), StillPossible)
    assert len(shard.admin().list_staged(mine.desc_id)) == 2  # its part and manifest stay
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(InvalidUsageError, match="max_append_wait"):
            _settings(shard.url, max_append_wait=bad)
    assert AttemptOptions.from_env({"SHARDSINK_MAX_APPEND_WAIT_S": "120"}).max_append_wait == timedelta(seconds=120)


def test_an_idle_wait_with_nobody_at_the_upper_gives_its_turn_up(tmp_path: Path) -> None:
    """``--run-backwards`` at one active run: the earlier runs cannot start while this one waits."""
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    mine = Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1)
    idle = {"status": "idle", "lower": 10, "upper": 0, "waiting_since": time.time() - 400, "idle_s": 400}
    for attempt, raised in ((1, AirflowSkipException), (3, AirflowFailException)):
        context = _context(shard.url)
        _resume(context, idle)
        with pytest.raises(raised, match="gave its turn up"):
            _append(_settings(shard.url), context, [mine], attempt)
        pushed = context["pushed"]["return_value"]
        assert pushed["lost"] and pushed["upper"] == 0 and pushed["gave_up"] is True
    # Someone is at the upper: keep waiting, no more idle hand-backs (until max_append_wait).
    _stage(shard, Description(make_desc_id("d", "backfill__2025-03-01", 1), 0, 10, 1))
    context = _context(shard.url)
    _resume(context, idle)
    with pytest.raises(TaskDeferred) as d:
        _append(_settings(shard.url), context, [mine])
    assert d.value.trigger.serialize()[1]["catch_up_after"] is None


def _run(trigger: TurnTrigger, timeout: float = 30) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout))


def test_the_turn_trigger_hands_back_when_the_upper_reaches_the_lower_or_the_deadline(tmp_path: Path) -> None:
    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    now = time.time()
    args: dict[str, Any] = {"shard_url": shard.url, "lower": 20, "poke_interval": 0.01, "waiting_since": now,
                            "deadline": now + 60, "behind": "x"}
    seen: list[int | None] = []

    def commit_next(**kw: Any) -> None:  # each poke below the lower: the next day commits
        seen.append(kw["upper"])
        lo = kw["upper"]
        if lo < 20:
            shard.append(table_of(rows_for(f"d{lo}", lo, lo + 10)), lower=lo, upper=lo + 10, desc_id=f"d{lo}")

    remove = hooks.register("trigger.poked", commit_next)
    try:
        events = _run(TurnTrigger(**args))
    finally:
        remove()
    assert seen == [0, 10, 20]  # it kept waiting at 10
    assert events == [{"status": "reached", "lower": 20, "upper": 20, "waiting_since": now, "behind": "x"}]
    assert _run(TurnTrigger(**{**args, "lower": 30, "deadline": time.time() + 0.3}))[0]["status"] == "timeout"
    got = _run(TurnTrigger(**{**args, "lower": 30, "catch_up_after": 0.2}))[0]
    assert got["status"] == "idle"
    for bad in ({"lower": -1}, {"poke_interval": 0}, {"deadline": now - 1}, {"shard_url": ""},
                {"waiting_since": float("nan")}, {"behind": 3}):
        with pytest.raises(InvalidUsageError):
            TurnTrigger(**{**args, **bad})
    kind, kwargs = TurnTrigger(**args).serialize()
    assert kind == "shardsink.airflow.triggers.TurnTrigger" and TurnTrigger(**kwargs).serialize() == (kind, kwargs)


def test_what_a_given_up_turn_staged_goes_once_the_catch_up_passes_it(tmp_path: Path) -> None:
    from shardsink.airflow.results import AppendReport

    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    ahead = Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1)
    _stage(shard, ahead)
    xcoms = {"attempt_1.append": to_builtins(AppendReport(shard=shard.url, lost=("gave its turn up",), upper=0,
                                                          gave_up=True)),
             "attempt_1.mint": [to_builtins(ahead)]}
    assert given_up(_with_xcoms(_context(shard.url), xcoms), 2) == [ahead]
    # Attempt 2 catches up from the upper, but its chain loses (a racing run committed [0, 20)):
    # the given-up description is still possible? No: the upper passed it, yet nothing of attempt 2
    # committed, so nothing is settled; attempt 3 commits and then deletes what can never commit.
    catch_up = Description(make_desc_id("d", "backfill__2025-03-02", 2), 0, 10, 2)
    _stage(shard, catch_up)
    out = _append(_settings(shard.url), _with_xcoms(_context(shard.url), xcoms), [catch_up], 2)
    assert out["upper"] == 10 and len(shard.admin().list_staged(ahead.desc_id)) == 2  # still possible: kept
    shard.append(table_of(rows_for("c", 10, 20)), lower=10, upper=20, desc_id="racer")
    third = Description(make_desc_id("d", "backfill__2025-03-02", 3), 20, 30, 3)
    _stage(shard, third)
    _append(_settings(shard.url), _with_xcoms(_context(shard.url), xcoms), [third], 3)
    assert shard.admin().list_staged(ahead.desc_id) == []


def _with_xcoms(context: dict[str, Any], xcoms: dict[str, Any]) -> dict[str, Any]:
    context["ti"].xcom_pull = lambda task_ids, key="return_value": xcoms.get(task_ids) if key == "return_value" \
        else None
    return context


def test_the_turn_trigger_appends_the_chain_when_its_turn_comes_and_the_task_reports_it_as_its_own(
        tmp_path: Path) -> None:
    from shardsink.airflow.results import TurnCommit

    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    settings = _settings(shard.url)
    earlier = Description(make_desc_id("d", "backfill__2025-03-01", 1), 0, 10, 1)
    chain = [Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1),
             Description(make_desc_id("d", "backfill__2025-03-02", 1), 20, 30, 1)]
    for d in (earlier, *chain):
        _stage(shard, d)
    writer = "airflow:d/backfill__2025-03-02"
    context = _context(shard.url)
    with pytest.raises(TaskDeferred) as deferred:  # the append task defers, handing its chain to the trigger
        _append(settings, context, chain)
    _, kwargs = deferred.value.trigger.serialize()
    assert kwargs["commit"] == to_builtins(TurnCommit(chain=tuple(chain), slots=1, writer=writer))
    trigger = TurnTrigger(**{**kwargs, "poke_interval": 0.01})  # as the triggerer rebuilds it from its row
    remove = _after_first_poke(lambda: shard.append(table_of(rows_for(earlier.desc_id, 0, 10)), lower=0, upper=10,
                                                    desc_id=earlier.desc_id))
    try:
        (event,) = _run(trigger)
    finally:
        remove()
    # Committed on the triggerer, before the task is back: the next interval's turn has come.
    assert event["status"] == "reached" and shard.info().upper == 30
    log = {c.desc_id: c for _, c in shard.log(limit=10) if c.kind == "append"}
    assert {log[d.desc_id].writer for d in chain} == {writer}, "the shard log says this run committed them"
    # The task resumes and calls the same operation: the log's writer makes the commits its own.
    _resume(context, event)
    out = _append(settings, context, chain)
    assert [(c["desc_id"], c["status"]) for c in out["committed"]] == [(d.desc_id, "committed") for d in chain]
    assert out["committed_at"] == datetime.fromisoformat(log[chain[1].desc_id].at).timestamp()
    assert out["waited_for"] == kwargs["behind"]
    assert {o.kind for d in chain for o in shard.admin().list_staged(d.desc_id)} == {"part"}  # the batches'
    # Another run's commit of the same description (a twin under another writer) is not reported as its own.
    other = _context(shard.url)
    other["dag_run"] = SimpleNamespace(start_date=datetime.now(UTC), run_id="manual__x", conf={}, dag_id="d")
    out = _append(settings, other, chain[:1])
    assert [c["status"] for c in out["committed"]] == ["already_committed"]


def test_a_turn_trigger_appends_only_at_its_lower_and_never_waits_on_the_shared_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardsink.airflow import triggers
    from shardsink.airflow.results import TurnCommit
    from shardsink.errors import StorageError
    from shardsink.storage.local import LocalBlob

    shard = Shard.create((tmp_path / "s").as_uri(), SCHEMA, upper=0)
    mine = Description(make_desc_id("d", "backfill__2025-03-02", 1), 10, 20, 1)
    now = time.time()
    args: dict[str, Any] = {"shard_url": shard.url, "lower": 10, "poke_interval": 0.05, "waiting_since": now,
                            "deadline": now + 60,
                            "commit": to_builtins(TurnCommit(chain=(mine,), slots=1, writer="airflow:d/r"))}
    # Its writes staged nothing (a manifest missing): nothing committed, the task settles it.
    shard.append(table_of(rows_for("e", 0, 10)), lower=0, upper=10, desc_id="earlier")
    (event,) = _run(TurnTrigger(**args))
    assert event["status"] == "reached" and shard.info().upper == 10
    # Cancelled (the task cleared while deferred: Airflow calls on_kill): it starts no commit.
    _stage(shard, mine)
    cancelled = TurnTrigger(**args)
    asyncio.run(cancelled.on_kill())
    (event,) = _run(cancelled)
    assert event["status"] == "reached" and shard.info().upper == 10
    # A transient store error that a retry would wait out: the trigger stops at once, it never sleeps.
    failed: list[str] = []
    armed: list[bool] = []
    real_get = LocalBlob.get

    def flaky_get(self: LocalBlob, key: str) -> Any:
        if armed and not failed:
            failed.append(key)
            raise StorageError(f"injected: GET {key} failed (a 503)")
        return real_get(self, key)

    monkeypatch.setattr(LocalBlob, "get", flaky_get)
    remove = hooks.register("trigger.poked", lambda **_: armed.append(True))
    refused: list[float] = []
    refuse = triggers._refuse_to_wait

    def record(seconds: float) -> None:
        refused.append(seconds)
        refuse(seconds)

    monkeypatch.setattr(triggers, "_refuse_to_wait", record)
    try:
        (event,) = _run(TurnTrigger(**args))
    finally:
        remove()
        monkeypatch.undo()
    assert event["status"] == "reached" and shard.info().upper == 10 and failed
    assert len(refused) == 1, refused  # the one retry's wait was refused (it raised), never slept
    # Past its lower (a catch-up covered it): the task settles the fate; the trigger commits nothing.
    shard.append(table_of(rows_for("c", 10, 20)), lower=10, upper=20, desc_id="catch-up")
    (event,) = _run(TurnTrigger(**args))
    assert event["status"] == "reached" and shard.info().upper == 20
    assert shard.fate(mine.desc_id, mine.lower) == CannotCommit(20)
    later = to_builtins(Description("y", 20, 30, 1))
    for bad in ({"chain": []}, {"chain": [to_builtins(Description("x", 20, 30, 1))]}, {"slots": 0},
                {"writer": ""}, {"writer": "w" * 1025}, {"format": 9}, {"slots": "2"},
                {"chain": [to_builtins(mine), {**later, "lower": 25}]}, {"chain": [{**to_builtins(mine), "format": 2}]},
                {"chain": [{**to_builtins(mine), "upper": 10}]}):
        with pytest.raises(InvalidUsageError):
            TurnTrigger(**{**args, "commit": {**args["commit"], **bad}})
    long_writer = {**args["commit"], "writer": "airflow:" + "d" * 250 + "/" + "r" * 250, "chain": [to_builtins(mine),
                                                                                               later]}
    kind, kwargs = TurnTrigger(**{**args, "commit": long_writer}).serialize()  # Airflow's longest ids
    assert TurnTrigger(**kwargs).serialize() == (kind, kwargs)
