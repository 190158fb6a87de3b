"""The option objects of ``ingest_dag`` / ``view_dag`` (SparkOptions, ShardOptions, AttemptOptions).

No scheduler, no Spark: the DAG objects are only built and compared, serialized as the
DAG processor stores them (task ids, trigger rules, every operator argument).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shardsink.airflow import AttemptOptions, ShardOptions, SparkOptions, ingest_dag, view_dag
from shardsink.airflow.credentials import AwsAccess, connection_options
from shardsink.airflow.deprecated import FlatOptionWarning
from shardsink.airflow.settings import IngestSettings
from shardsink.errors import InvalidUsageError
from shardsink.sinks.materialize import view
from shardsink.sources import LandingSource
from shardsink.storage.options import StoreOptions

START = datetime(2024, 1, 2, tzinfo=UTC)

#: Every deprecated flat keyword of ingest_dag with a non-default value, and the same as option objects.
FLAT: dict[str, Any] = {
    "spark_conn_id": "spark_other", "spark_conf": {"spark.executor.memory": "2g"}, "spark_env": {"A": "1"},
    "aws_conn_id": "aws_lake", "initial_upper": 86_400_000, "max_span": timedelta(hours=6), "retention": "7d",
    "max_attempts": 3, "retry_backoff": 0.5, "retry_backoff_cap": 10.0, "task_retries": 4,
    "task_retry_delay": timedelta(seconds=7), "max_chain": 4, "catch_up_after": timedelta(seconds=90),
    "poke_interval": timedelta(seconds=5),
}
OPTIONS: dict[str, Any] = {
    "spark": SparkOptions(conn_id="spark_other", conf={"spark.executor.memory": "2g"}, env={"A": "1"}),
    "shard": ShardOptions(aws_conn_id="aws_lake", initial_upper=86_400_000, max_span=timedelta(hours=6),
                          retention="7d"),
    "attempts": AttemptOptions(max_attempts=3, backoff=0.5, backoff_cap=10.0, task_retries=4,
                               task_retry_delay=timedelta(seconds=7), max_chain=4,
                               catch_up_after=timedelta(seconds=90), poke_interval=timedelta(seconds=5)),
}
VIEW_ONLY_FLAT = {k: v for k, v in FLAT.items() if k not in ("max_chain", "catch_up_after", "poke_interval")}
VIEW_OPTIONS = {**OPTIONS, "attempts": dataclasses.replace(OPTIONS["attempts"], max_chain=16,
                                                           catch_up_after=timedelta(minutes=5),
                                                           poke_interval=timedelta(seconds=15))}


def _ingest(tmp_path: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("writers", 3)
    return ingest_dag(dag_id="opt_ingest", shard_url=(tmp_path / "shard").as_uri(), start_date=START,
                      source=LandingSource(str(tmp_path / "landing"), time_column="event_time"), **kwargs)


def _view(tmp_path: Path, **kwargs: Any) -> Any:
    return view_dag(dag_id="opt_view", output_url=(tmp_path / "out").as_uri(), start_date=START, schedule=None,
                    view=view(inputs={"events": (tmp_path / "shard").as_uri()}, sql="SELECT * FROM events"), **kwargs)


def _serialized(dag: Any) -> dict[str, Any]:
    from airflow.serialization.serialized_objects import DagSerialization

    def scrub(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if k not in ("fileloc", "relative_fileloc")}
        if isinstance(x, list):
            return [scrub(v) for v in x]
        return x

    return scrub(DagSerialization.to_dict(dag))


def _write_settings(dag: Any) -> dict[str, Any]:
    write = dag.get_task("attempt_1.write")
    return {k: write.partial_kwargs.get(k) for k in ("conn_id", "conf", "env_vars", "aws_conn_id", "retries",
                                                      "retry_delay", "shard_url")}


def _flat(build: Any, tmp_path: Path, flat: dict[str, Any]) -> Any:
    with pytest.warns(FlatOptionWarning):
        return build(tmp_path, **flat)


def test_option_objects_build_the_same_dag_as_the_deprecated_flat_keywords(tmp_path: Path) -> None:
    old, new = _flat(_ingest, tmp_path, FLAT), _ingest(tmp_path, **OPTIONS)
    assert sorted(old.task_ids) == sorted(new.task_ids)
    assert [t for t in new.task_ids if t.startswith("attempt_")][-1].startswith("attempt_3.")
    assert _write_settings(old) == _write_settings(new) == {
        "conn_id": "spark_other", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                           "spark.executor.memory": "2g"},
        "env_vars": {"A": "1"}, "aws_conn_id": "aws_lake", "retries": 4, "retry_delay": timedelta(seconds=7),
        "shard_url": (tmp_path / "shard").as_uri()}
    assert _serialized(old) == _serialized(new)

    old_view, new_view = _flat(_view, tmp_path, VIEW_ONLY_FLAT), _view(tmp_path, **VIEW_OPTIONS)
    assert sorted(old_view.task_ids) == sorted(new_view.task_ids)
    assert _write_settings(old_view) == _write_settings(new_view)
    assert _write_settings(new_view)["conf"]["spark.sql.session.timeZone"] == "UTC"
    assert _serialized(old_view) == _serialized(new_view)


def test_defaults_are_the_same_with_and_without_option_objects(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlatOptionWarning)  # no option given: nothing deprecated used
        bare, explicit = _ingest(tmp_path), _ingest(tmp_path, spark=SparkOptions(), shard=ShardOptions(),
                                                    attempts=AttemptOptions())
    assert _serialized(bare) == _serialized(explicit)
    assert len([t for t in bare.task_ids if t.endswith(".mint")]) == 5


def test_a_deprecated_keyword_warns_naming_the_option_object_and_field(tmp_path: Path) -> None:
    with pytest.warns(FlatOptionWarning, match=r"ingest_dag\(retry_backoff=\.\.\.\) is deprecated.*"
                                                r"use attempts=AttemptOptions\(backoff=\.\.\.\)") as got:
        _ingest(tmp_path, retry_backoff=0.5)
    assert got[0].filename == __file__  # points at the DAG file's call, not at shardsink
    with pytest.warns(FlatOptionWarning, match=r"view_dag\(spark_conf=\.\.\.\).*spark=SparkOptions\(conf=\.\.\.\)"):
        _view(tmp_path, spark_conf={"x": "y"})
    # A flat keyword next to its option object sets that field over it.
    with pytest.warns(FlatOptionWarning, match=r"shard=ShardOptions\(max_span=\.\.\.\)"):
        mixed = _ingest(tmp_path, shard=ShardOptions(aws_conn_id="aws_lake", max_span=1000), max_span=2000)
    assert _serialized(mixed) == _serialized(_ingest(tmp_path, shard=ShardOptions(aws_conn_id="aws_lake",
                                                                                  max_span=2000)))


@pytest.mark.parametrize(("flat", "options", "named"), [
    ({"max_span": 0}, {"shard": ShardOptions(max_span=0)}, "max_span 0"),
    ({"initial_upper": -5}, {"shard": ShardOptions(initial_upper=-5)}, "-5"),
    ({"max_attempts": 0}, {"attempts": AttemptOptions(max_attempts=0)}, "max_attempts (0) must be at least 1"),
    ({"max_chain": 0}, {"attempts": AttemptOptions(max_chain=0)}, "max_chain 0"),
    ({"poke_interval": timedelta(0)}, {"attempts": AttemptOptions(poke_interval=timedelta(0))}, "poke_interval"),
    ({"retry_backoff_cap": float("inf")}, {"attempts": AttemptOptions(backoff_cap=float("inf"))}, "inf"),
    ({"retention": "seven days"}, {"shard": ShardOptions(retention="seven days")}, "not a duration"),
])
def test_a_bad_value_is_refused_as_before(tmp_path: Path, flat: dict[str, Any], options: dict[str, Any],
                                          named: str) -> None:
    with pytest.raises(InvalidUsageError) as by_option:
        _ingest(tmp_path, **options)
    with pytest.warns(FlatOptionWarning), pytest.raises(InvalidUsageError) as by_flat:
        _ingest(tmp_path, **flat)
    assert named in str(by_option.value)
    assert str(by_option.value) == str(by_flat.value)
    with pytest.raises(InvalidUsageError, match=r"writers \(0\) and max_attempts \(5\) must be at least 1"):
        _ingest(tmp_path, writers=0)


def test_option_objects_are_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SparkOptions().conn_id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        AttemptOptions(3)  # type: ignore[misc]


def test_the_attempts_backoff_is_a_jittered_capped_retry_policy() -> None:
    settings = IngestSettings(dag_id="d", shard_url="file:///tmp/never-opened", source_spec={}, writers=1,
                              max_span=None, max_attempts=6, initial_upper=0, backoff_base=0.5, backoff_cap=3.0)
    policy = settings.attempts_policy
    assert (policy.name, policy.attempts, policy.first_wait, policy.max_wait) == ("attempts", 6, 0.5, 3.0)
    for attempt in range(2, 12):
        waits = [settings.backoff(attempt) for _ in range(200)]
        assert all(0 <= w <= min(3.0, 0.5 * 2 ** (attempt - 2)) for w in waits), attempt  # capped
        assert len(set(waits)) > 150, attempt  # full jitter
    assert max(settings.backoff(30) for _ in range(200)) > 1.5, "capped at backoff_cap, not near 0"
    assert not hasattr(settings, "sleep"), "the attempts never sleep: the next mint is rescheduled"


def test_an_aws_connection_sets_the_store_timeouts_in_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDSINK_S3_CONNECT_TIMEOUT", raising=False)
    monkeypatch.setenv("SHARDSINK_S3_READ_TIMEOUT", "40")
    assert connection_options({"region_name": "eu-west-1"}) is None, "no botocore settings: the environment's"
    assert connection_options({"config_kwargs": {"signature_version": "s3v4"}}) is None
    got = connection_options({"config_kwargs": {"connect_timeout": 2, "max_pool_connections": 8}})
    assert got == StoreOptions(connect_timeout=2, read_timeout=40.0, max_pool=8)
    with pytest.raises(InvalidUsageError, match="read_timeout"):
        connection_options({"config_kwargs": {"read_timeout": -1}})


def test_a_timeout_set_in_the_spark_env_wins_over_the_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit's environment: an explicit SHARDSINK_S3_* of the Spark env is never overridden
    by the connection's config_kwargs; the ones it leaves unset come from the connection."""

    class Creds:  # what AwsBaseHook.get_credentials returns (botocore's ReadOnlyCredentials)
        access_key, secret_key, token = "AK", "SK", None

    class Hook:
        def get_credentials(self, region_name: str | None = None) -> Creds:
            return Creds()

    monkeypatch.delenv("SHARDSINK_S3_CONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("SHARDSINK_S3_READ_TIMEOUT", raising=False)
    options = connection_options({"config_kwargs": {"connect_timeout": 2, "read_timeout": 9}})
    access = AwsAccess(conn_id="c", hook=Hook(), session=None, endpoint_url=None, region=None, options=options)
    assert access.spark_env()["SHARDSINK_S3_READ_TIMEOUT"] == "9"
    env = access.spark_env(explicit={"SHARDSINK_S3_READ_TIMEOUT": "60", "A": "1"})
    assert "SHARDSINK_S3_READ_TIMEOUT" not in env  # the Spark env's 60 stands (merged over by nothing)
    assert float(env["SHARDSINK_S3_CONNECT_TIMEOUT"]) == 2 and env["AWS_ACCESS_KEY_ID"] == "AK" and "A" not in env


def test_attempt_options_from_the_environment_are_the_example_dags_one_reading() -> None:
    assert AttemptOptions.from_env({}) == AttemptOptions()
    got = AttemptOptions.from_env({"SHARDSINK_MAX_ATTEMPTS": "3", "SHARDSINK_RETRY_BACKOFF": "0.2",
                                   "SHARDSINK_TASK_RETRIES": "0", "SHARDSINK_TASK_RETRY_DELAY_S": "1",
                                   "SHARDSINK_CATCH_UP_AFTER_S": "0", "SHARDSINK_POKE_S": "", "OTHER": "x"})
    assert got == AttemptOptions(max_attempts=3, backoff=0.2, task_retries=0, task_retry_delay=timedelta(seconds=1),
                                 catch_up_after=timedelta(0))
    with pytest.raises(InvalidUsageError, match="SHARDSINK_MAX_ATTEMPTS='five'"):
        AttemptOptions.from_env({"SHARDSINK_MAX_ATTEMPTS": "five"})
    for name in ("example_arrivals.py", "example_kafka.py"):  # the shared reading, not a copy of it
        text = (Path(__file__).resolve().parents[2] / "dags" / name).read_text()
        assert "AttemptOptions.from_env()" in text and "SHARDSINK_TASK_RETRY_DELAY_S\"" not in text, name


def test_part_order_reaches_the_write_jobs_request_and_views_keep_sorted_parts(tmp_path: Path) -> None:
    from shardsink.sinks.description import Description

    assert _ingest(tmp_path).get_task("attempt_1.write").partial_kwargs["part_order"] == "unordered"  # the default
    sorted_dag = _ingest(tmp_path, shard=ShardOptions(part_order="sorted"))
    assert sorted_dag.get_task("attempt_1.write").partial_kwargs["part_order"] == "sorted"
    dag = _ingest(tmp_path, shard=ShardOptions(part_order="unordered"))
    write = dag.get_task("attempt_1.write")
    assert write.partial_kwargs["part_order"] == "unordered"
    op = write.operator_class(task_id="w", shard_url="file:///s", source_spec=write.partial_kwargs["source_spec"],
                              slots=1, slot=0, desc=None, part_order="unordered")
    req = op.job_request(Description(desc_id="d-1", lower=0, upper=10, attempt=1))
    assert req.part_order == "unordered", "the typed spark-submit request carries the order to the job"
    with pytest.raises(InvalidUsageError, match="part_order"):
        _ingest(tmp_path, shard=ShardOptions(part_order="shuffled"))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError, match="sorted parts"):
        _view(tmp_path, shard=ShardOptions(part_order="unordered"))


def test_start_date_is_required_and_read_as_airflow_reads_it(tmp_path: Path) -> None:
    """Issue 35: no silent 2024-01-01. A missing start_date fails the parse naming the setting; a
    naive one is in Airflow's default timezone (UTC here), as the DAG reads it, so the new
    shard's initial upper is the DAG's first interval start."""
    from shardsink.airflow.build import checked_start_date

    source = LandingSource(str(tmp_path / "landing"), time_column="event_time")
    with pytest.raises(InvalidUsageError, match=r"ingest_dag\(dag_id='mine'\) needs start_date=: .*first day of"):
        ingest_dag(dag_id="mine", shard_url=(tmp_path / "shard").as_uri(), source=source)
    with pytest.raises(InvalidUsageError, match=r"view_dag\(dag_id='v'\) needs start_date="):
        view_dag(dag_id="v", output_url=(tmp_path / "out").as_uri(), schedule=None,
                 view=view(inputs={"events": (tmp_path / "shard").as_uri()}, sql="SELECT * FROM events"))
    with pytest.raises(InvalidUsageError, match="start_date must be a datetime, got str '2025-03-01'"):
        ingest_dag(dag_id="mine", shard_url=(tmp_path / "shard").as_uri(), source=source,
                   start_date="2025-03-01")  # type: ignore[arg-type]
    naive = checked_start_date("ingest_dag", "mine", datetime(2025, 3, 1))
    assert naive == datetime(2025, 3, 1, tzinfo=UTC)
    dag = ingest_dag(dag_id="mine", shard_url=(tmp_path / "shard").as_uri(), source=source,
                     start_date=datetime(2025, 3, 1))
    assert dag.start_date == naive


def _calls(text: str, name: str) -> list[str]:
    """The argument text of every ``name(...)`` call in ``text`` (balanced parentheses)."""
    out = []
    for m in re.finditer(rf"\b{name}\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1])
    return out


def test_no_document_shows_a_deprecated_flat_keyword() -> None:
    """Issue 35: docs teach the option objects (``shard=ShardOptions(aws_conn_id=...)``), never the
    flat keywords that warn; checked in every Markdown file, code blocks and prose alike."""
    from shardsink.airflow.deprecated import INGEST_ALIASES, VIEW_ALIASES

    root = Path(__file__).resolve().parents[2]
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    found = []
    for doc in docs:
        text = doc.read_text()
        for name, aliases in (("ingest_dag", INGEST_ALIASES), ("view_dag", VIEW_ALIASES)):
            for args in _calls(text, name):
                top = args
                while (inner := re.sub(r"\([^()]*\)", "", top)) != top:  # keywords at depth 1 only
                    top = inner
                found += [f"{doc.relative_to(root)}: {name}({k}=...)" for k in re.findall(r"\b(\w+)\s*=", top)
                          if k in aliases]
    assert not found, f"deprecated flat keywords in the docs: {found}"


def test_engine_connect_reaches_the_write_tasks_of_both_factories_and_the_dry_runs_settings(tmp_path: Path) -> None:
    """``SparkOptions(engine="connect")``: the ingest and the view DAG's write tasks run over Connect
    (a view's too), and the settings name the connection a dry run's session uses; spark-submit
    DAGs name none (their dry runs start a local session)."""
    from shardsink.airflow.build import sink_settings

    connect = SparkOptions(engine="connect", connect_conn_id="cx")
    for dag in (_ingest(tmp_path, spark=connect), _view(tmp_path, spark=connect)):
        write = dag.get_task("attempt_1.write").partial_kwargs
        assert (write["engine"], write["connect_conn_id"]) == ("connect", "cx"), dag.dag_id

    def settings(spark: SparkOptions) -> IngestSettings:
        return sink_settings(dag_id="d", url="file:///tmp/s", spec={}, writers=1, start_date=START,
                             shard=ShardOptions(), attempts=AttemptOptions(), spark=spark)
    assert settings(connect).connect_conn_id == "cx"
    assert settings(SparkOptions(connect_conn_id="cx")).connect_conn_id is None


def _weights(dag: Any) -> dict[str, int]:
    """Each task's priority weight as the scheduler computes it when it creates a run's task
    instances: from the serialized DAG, by the task's weight rule."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.serialized_objects import DagSerialization

    sd = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return {t.task_id: t.weight_rule.get_weight(TaskInstance(task=t, run_id="r", dag_version_id=None))
            for t in sd.tasks}


def test_a_runs_later_tasks_outrank_its_earlier_ones_unless_the_dag_says_otherwise(tmp_path: Path) -> None:
    """Both factories' tasks rank above the tasks before them (an append above its writes above its
    mint, a later attempt above an earlier one), so Airflow's tie-break by logical date queues a
    backfill's earliest interval's writes before later intervals' mints and writes; a DAG's own
    ``default_args`` weight rule wins."""
    for dag in (_ingest(tmp_path), _view(tmp_path)):
        w = _weights(dag)
        order = [f"attempt_{k}.{t}" for k in (1, 2) for t in ("mint", "write", "append")]
        assert [w[t] for t in order] == sorted(w[t] for t in order), (dag.dag_id, w)
        assert len({w[t] for t in order}) == len(order), w
    w = _weights(_ingest(tmp_path, default_args={"weight_rule": "downstream", "retries": 7}))
    assert w["attempt_1.mint"] > w["attempt_1.write"] > w["attempt_1.append"], w
