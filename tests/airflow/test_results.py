"""The XCom values of a sink DAG run are plain JSON values of typed structs, decoded once by each
consumer; the mint and report tasks read the shard's head once and the watermark once.

No scheduler, no Spark: the task bodies run in-process with a dict as XCom (values stored as
JSON text, so anything that is not plain JSON fails here as in Airflow); the writes' parts
and manifests are staged directly.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from shardsink.airflow import tasks
from shardsink.airflow.results import AppendReport, MintTarget, RunReport
from shardsink.airflow.run_context import earlier_appends
from shardsink.airflow.settings import IngestSettings
from shardsink.core.shard import Shard
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import decode, descriptions
from shardsink.sinks.staging import write_manifest
from shardsink.sources.landing import WATERMARK_KEY, LandingSource
from shardsink.storage import retry
from shardsink_dev.synthetic import DAY, SCHEMA, generate


class XComs:
    """A run's XComs as Airflow keeps them: JSON, per (task id, key)."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], str] = {}

    def ti(self, task_id: str) -> Any:
        def push(key: str, value: Any) -> None:
            self.store[(task_id, key)] = json.dumps(value)

        def pull(task_ids: str, key: str = "return_value") -> Any:
            got = self.store.get((task_ids, key))
            return None if got is None else json.loads(got)

        return SimpleNamespace(xcom_push=push, xcom_pull=pull)

    def context(self, task_id: str) -> dict[str, Any]:
        return {"ti": self.ti(task_id), "params": {}, "task": SimpleNamespace(get_flat_relatives=lambda upstream: []),
                "dag_run": SimpleNamespace(run_id="manual__1", conf={}, start_date=datetime.now(UTC)),
                "data_interval_start": datetime.fromtimestamp(0, UTC),
                "data_interval_end": datetime.fromtimestamp(2 * DAY / 1000, UTC),
                "outlet_events": {"asset": SimpleNamespace(extra=None)}}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Head reads (``head``) and watermark reads (``watermark``) of every store handle (a
    pass-through spy on the public request counter)."""
    seen: Counter[str] = Counter()
    real = retry.RequestCounter.count

    def count(self: retry.RequestCounter, method: str, key: str) -> None:
        if (method, key) == ("get", "state/LATEST.json") or (method == "list" and key.startswith("state/v")):
            seen["head"] += 1
        if key == WATERMARK_KEY:
            seen["watermark"] += 1
        real(self, method, key)

    monkeypatch.setattr(retry.RequestCounter, "count", count)
    yield seen


def test_one_run_passes_typed_json_results_and_reads_each_fact_once(tmp_path: Any, reads: Counter[str]) -> None:
    url, land = f"file://{tmp_path}/shard", f"file://{tmp_path}/landing"
    generate(land, start=0, days=2, files_per_day=1, rows_per_file=5)
    Shard.create(url, SCHEMA, upper=0)
    settings = IngestSettings(dag_id="d", shard_url=url, source_spec=LandingSource(land).spec(), writers=2,
                              max_span=DAY, max_attempts=2, initial_upper=0)
    x = XComs()
    reads.clear()
    minted = tasks.mint_task(settings, 1, x.context("attempt_1.mint"))
    assert dict(reads) == {"head": 1, "watermark": 1}
    x.ti("attempt_1.mint").xcom_push("return_value", minted)
    chain = descriptions(x.ti("append").xcom_pull("attempt_1.mint"))
    assert [(d.lower, d.upper) for d in chain] == [(0, DAY), (DAY, 2 * DAY)]
    plan = decode(x.ti("append").xcom_pull("attempt_1.mint", "target"), MintTarget, what="target")
    assert (plan.target, plan.watermark, plan.corrects) == (2 * DAY, 2 * DAY, None)
    for d in chain:
        for slot in range(2):
            t = pa.table({"user": ["u"], "action": ["a"], "amount": [slot], "_time": [d.lower + slot]})
            s = Shard(url).stage(t, lower=d.lower, upper=d.upper, desc_id=d.desc_id, schema=SCHEMA)
            write_manifest(Shard(url), d, slot=slot, slots=2, parts=s.parts)
    appended = tasks.append_task(settings, 1, minted, x.context("attempt_1.append"), "asset")
    report = decode(json.loads(json.dumps(appended)), AppendReport, what="append")
    assert [(c.lower, c.upper, c.status) for c in report.committed] == [(0, DAY, "committed"),
                                                                        (DAY, 2 * DAY, "committed")]
    assert report.upper == 2 * DAY and report.lost == () and report.retry_at is None
    reads.clear()
    out = decode(tasks.report_task(settings, x.context("report")), RunReport, what="report")
    assert reads["head"] == 1
    assert out.committed == report.committed and (out.target, out.upper) == (2 * DAY, 2 * DAY)


def test_a_malformed_xcom_is_refused_naming_the_task_and_field() -> None:
    x = XComs()
    x.ti("attempt_1.append").xcom_push("return_value", {"shard": "s", "upper": "high"})
    with pytest.raises(InvalidUsageError, match=r"XCom return_value of attempt_1\.append is malformed.*\$\.upper"):
        earlier_appends(x.context("attempt_2.mint"), 2)
