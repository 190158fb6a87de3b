"""airflow/gates.py: every wait of a mint DEFERS (issue 21 §2): to an :class:`EarlierIntervalsTrigger`
while earlier intervals are not covered and the shard progresses, to a ``DateTimeTrigger``
until a lost race's backoff ends; always resuming through the task's ``resume_after_wait``.
No wait once there is nothing to wait for. The gates run in-process against a real local
shard, with a real ``@shard_task`` operator as the task (its ``defer`` raises ``TaskDeferred``).
The triggers themselves run for real in tests/airflow/test_triggers.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from support import SCHEMA

from shardsink import Shard
from shardsink.airflow.gates import far_behind, retry_gate, wait_for_earlier_intervals
from shardsink.airflow.results import AppendReport
from shardsink.airflow.settings import IngestSettings
from shardsink.airflow.triggers import RESUME_METHOD, EarlierIntervalsTrigger
from shardsink.provider.operators import shard_task
from shardsink.sinks.description import to_builtins


@pytest.fixture
def shard(tmp_path: Path) -> Shard:
    return Shard.create((tmp_path / "shard").as_uri(), SCHEMA, upper=0)


def _settings(url: str, catch_up_after: float = 300) -> IngestSettings:
    return IngestSettings(dag_id="d", shard_url=url, source_spec={}, writers=1, max_span=None, max_attempts=3,
                          initial_upper=0, catch_up_after=catch_up_after, poke_interval=7.0)


def _context(shard: Shard, xcoms: dict[str, Any] | None = None) -> dict[str, Any]:
    """A mint's context: a real ``@shard_task`` operator (the mint's class) and the run's XComs."""
    with DAG("gates", schedule=None):
        @shard_task(task_id="mint", shard_role="mint", shard_url=shard.url)
        def body() -> None:
            return None

        mint = body().operator
    pull = (xcoms or {}).get
    return {"task": mint, "dag_run": SimpleNamespace(start_date=datetime.now(UTC)),
            "ti": SimpleNamespace(xcom_pull=lambda task_ids, key="return_value": pull(task_ids))}


def test_an_uncovered_earlier_interval_defers_to_the_upper_watching_trigger(shard: Shard) -> None:
    context = _context(shard)
    info = shard.info()
    with pytest.raises(TaskDeferred) as d:
        wait_for_earlier_intervals(_settings(shard.url), info, 20, context)
    assert d.value.method_name == RESUME_METHOD and callable(getattr(context["task"], RESUME_METHOD))
    assert isinstance(d.value.trigger, EarlierIntervalsTrigger)
    assert d.value.trigger.serialize()[1] == {
        "shard_url": shard.url, "interval_start": 20, "catch_up_after": 300.0, "poke_interval": 7.0,
        "run_started": context["dag_run"].start_date.timestamp(), "aws_conn_id": None}
    # No patience left, or nothing to wait for: the gate returns and the run goes on itself.
    wait_for_earlier_intervals(_settings(shard.url, catch_up_after=0), info, 20, context)
    wait_for_earlier_intervals(_settings(shard.url), info, 0, context)
    wait_for_earlier_intervals(_settings(shard.url), info, None, context)


def test_a_lost_race_defers_the_next_mint_until_its_backoff_ends(shard: Shard) -> None:
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    retry_at = round(time.time() + 20, 3)
    lost = to_builtins(AppendReport(shard=shard.url, lost=("lost the race",), upper=0, retry_at=retry_at))
    context = _context(shard, {"attempt_1.append": lost})
    with pytest.raises(TaskDeferred) as d:
        retry_gate(_settings(shard.url), 2, context)
    assert d.value.method_name == RESUME_METHOD
    assert isinstance(d.value.trigger, DateTimeTrigger)
    assert d.value.trigger.moment.timestamp() == pytest.approx(retry_at, abs=1e-3)
    # Once the backoff has passed (the resumed task), the gate lets the mint go on.
    over = to_builtins(AppendReport(shard=shard.url, lost=("lost the race",), upper=0, retry_at=time.time() - 1))
    assert retry_gate(_settings(shard.url), 2, _context(shard, {"attempt_1.append": over})) is False
    assert retry_gate(_settings(shard.url), 1, _context(shard)) is False


def test_a_resumed_catch_up_is_not_rejudged_on_a_skewed_worker_clock(shard: Shard) -> None:
    """The trigger said ``catch_up`` (the triggerer's clock): the resumed mint catches up instead of
    deferring again because its own clock is behind, unless the shard committed meanwhile."""
    context = _context(shard)
    info = shard.info()
    resume = getattr(context["task"], RESUME_METHOD)
    context["task"].execute = lambda ctx: None  # only the event bookkeeping of the resume is under test
    resume({}, {"status": "catch_up", "upper": 0, "last_commit_at": info.last_commit.at})
    wait_for_earlier_intervals(_settings(shard.url), info, 20, context)  # returns: no second deferral
    resume({}, {"status": "catch_up", "upper": 0, "last_commit_at": "an older commit"})
    with pytest.raises(TaskDeferred):  # the shard moved since the trigger's read: wait again
        wait_for_earlier_intervals(_settings(shard.url), info, 20, context)


def test_a_resumed_backoff_is_not_rejudged_on_a_skewed_worker_clock(shard: Shard) -> None:
    retry_at = round(time.time() + 20, 3)  # the worker's clock is behind the triggerer's
    lost = to_builtins(AppendReport(shard=shard.url, lost=("lost the race",), upper=0, retry_at=retry_at))
    context = _context(shard, {"attempt_1.append": lost})
    context["task"].execute = lambda ctx: None
    getattr(context["task"], RESUME_METHOD)({}, datetime.fromtimestamp(retry_at, tz=UTC))
    assert retry_gate(_settings(shard.url), 2, context) is False


def test_a_wait_for_earlier_intervals_is_bounded(shard: Shard) -> None:
    with pytest.raises(TaskDeferred) as d:
        wait_for_earlier_intervals(_settings(shard.url), shard.info(), 20, _context(shard))
    assert d.value.timeout is not None and d.value.timeout.total_seconds() == 2 * 300 + 5 * 7.0 + 60


DAY_MS = 86_400_000


def _ms(*ymd: int) -> int:
    return int(datetime(*ymd, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def test_a_new_shard_far_behind_the_run_is_warned_about_naming_the_fix(tmp_path: Path) -> None:
    """Issue 35: a shard created at a start_date long before the data (2024-01-01, data of 2025-03).
    The warning names both fixes with this run's values; nothing is refused (a backward backfill
    over real history starts the same way)."""
    new = Shard.create((tmp_path / "new").as_uri(), SCHEMA, upper=_ms(2024, 1, 1))
    settings = IngestSettings(dag_id="d", shard_url=new.url, source_spec={}, writers=1, max_span=DAY_MS,
                              max_attempts=3, initial_upper=_ms(2024, 1, 1), max_chain=16)
    run = (_ms(2025, 3, 1), _ms(2025, 3, 2))
    warning = far_behind(settings, new.info(), run)
    assert warning is not None
    assert f"new shard {new.url} starts at upper {_ms(2024, 1, 1)} (2024-01-01T00:00:00+00:00), 425 batches" in warning
    assert "start_date=datetime(2025, 3, 1, tzinfo=UTC)" in warning
    assert f"ShardOptions(initial_upper={_ms(2025, 3, 1)})" in warning and "max_chain (16)" in warning
    assert f"shardsink drop {new.url} --yes" in warning
    # Within max_chain batches, or without max_span (one batch covers any gap): nothing to say.
    assert far_behind(settings, new.info(), (_ms(2024, 1, 17), _ms(2024, 1, 18))) is None
    assert far_behind(settings, new.info(), (_ms(2024, 1, 18), _ms(2024, 1, 19))) is not None  # 17 batches
    wide = IngestSettings(dag_id="d", shard_url=new.url, source_spec={}, writers=1, max_span=None, max_attempts=3,
                          initial_upper=0, max_chain=16)
    assert far_behind(wide, new.info(), run) is None
    assert far_behind(settings, new.info(), (None, None)) is None  # a manual run without an interval
    # A shard that holds a batch is catching up on purpose (a paused DAG): no warning.
    new.append(pa.table({"k": ["a"], "n": [1], "_time": [_ms(2024, 1, 1)], "_diff": [1]}),
               lower=_ms(2024, 1, 1), upper=_ms(2024, 1, 2))
    assert far_behind(settings, new.info(), run) is None


def test_the_mint_logs_and_pushes_the_warning_before_it_waits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from shardsink.airflow.tasks import mint_task
    from shardsink.sources import LandingSource
    from shardsink_dev.synthetic import publish_watermark

    landing = tmp_path / "landing"
    landing.mkdir()
    publish_watermark(str(landing), _ms(2025, 3, 1) + DAY_MS // 2)  # not covering the interval: no mint ahead
    url = (tmp_path / "shard").as_uri()
    settings = IngestSettings(dag_id="d", shard_url=url, source_spec=LandingSource(str(landing)).spec(), writers=1,
                              max_span=DAY_MS, max_attempts=3, initial_upper=_ms(2024, 1, 1))
    Shard.create(url, SCHEMA, upper=settings.initial_upper)  # as the first mint creates it
    context = _context(Shard(url))
    pushed: dict[str, Any] = {}
    context["ti"].xcom_push = lambda key, value: pushed.__setitem__(key, value)
    context["dag_run"] = SimpleNamespace(start_date=datetime.now(UTC), run_id="manual__now", conf={}, dag_id="d")
    context.update(params={}, data_interval_start=datetime(2025, 3, 1, tzinfo=UTC),
                   data_interval_end=datetime(2025, 3, 2, tzinfo=UTC))
    with caplog.at_level("WARNING", logger="shardsink.airflow"), pytest.raises(TaskDeferred):
        mint_task(settings, 1, context)  # then waits for the earlier intervals' runs
    assert "start_date=datetime(2025, 3, 1, tzinfo=UTC)" in pushed["warning"]
    assert pushed["warning"] in caplog.text
