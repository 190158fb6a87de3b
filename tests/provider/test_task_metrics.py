"""The metrics a shardsink task sends, received by a real StatsD (UDP) listener on 127.0.0.1.

The operator's own base is replaced by a stand-in whose ``execute`` ends as append ends
(the committed result; a lost race as AirflowSkipException from LostRaceError): this
checks the mixin's accounting; the real append path is covered by
tests/airflow/test_shards_page.py (``airflow dags test`` with StatsD).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from shardsink.provider import metrics
from shardsink.provider.operators import ShardTaskMixin
from shardsink.sinks.append import LostRaceError


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    from airflow.sdk._shared.observability.metrics import stats as sdk_stats

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(sock.getsockname()[1]))
    monkeypatch.setattr(sdk_stats, "_factory", None)
    monkeypatch.setattr(sdk_stats, "_backend", None)
    yield sock
    sock.close()


def _received(sock: socket.socket) -> list[str]:
    out: list[str] = []
    sock.settimeout(1)
    try:
        while True:
            out.extend(sock.recv(65535).decode().splitlines())
    except TimeoutError:
        return out


class _LosingAppend:
    def execute(self, context: Any) -> Any:
        try:
            raise LostRaceError("lost", expected=4, current=5, deleted=2)
        except LostRaceError as e:
            raise AirflowSkipException("lost the race") from e


class LosingAppend(ShardTaskMixin, _LosingAppend):
    shard_role = "append"
    dag_id = "d"
    task_id = "attempt_1.append"
    shard_url = "file:///tmp/s"
    source_spec: dict[str, Any] = {}  # noqa: RUF012


def test_a_lost_race_is_counted_and_the_skip_propagates(statsd: socket.socket) -> None:
    with pytest.raises(AirflowSkipException):
        LosingAppend().execute({})
    lines = _received(statsd)
    assert "airflow.shardsink.lost_races:1|c" in lines, lines
    assert any(ln.startswith("airflow.shardsink.task.append.duration:") and ln.endswith("|ms") for ln in lines)
    assert not any(ln.startswith("airflow.shardsink.commits") for ln in lines)


def test_metrics_never_fail_a_task_when_the_backend_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise RuntimeError("no backend")

    monkeypatch.setattr(metrics, "_stats", broken)
    metrics.committed(dag_id="d", shard="file:///tmp/s", rows=1, size=1)  # logged, not raised
