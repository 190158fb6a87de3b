"""Recording a source's failure is best effort: a store that keeps failing gets a few quick,
jittered tries under the named BEST_EFFORT policy (not the stores' full STORAGE policy), then
a warning, never an error that would hide the failure being reported."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from shardsink.reclock import health
from shardsink.storage.retry import BEST_EFFORT, STORAGE


def test_the_best_effort_policy_is_short_next_to_the_stores() -> None:
    assert BEST_EFFORT.name == "best_effort"
    assert BEST_EFFORT.attempts < STORAGE.attempts and BEST_EFFORT.deadline <= STORAGE.deadline / 10


def test_a_failure_that_cannot_be_recorded_gives_up_quickly_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: every request fails
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("SHARDSINK_S3_CONNECT_TIMEOUT", "0.5")
    waits: list[float] = []
    t = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="shardsink.reclock.health"):
        assert health.record_failure("s3://nowhere/remap", "boom", policy=BEST_EFFORT.with_sleep(waits.append)) is False
    assert time.monotonic() - t < 10
    assert len(waits) == BEST_EFFORT.attempts - 1, "every try but the last is followed by a jittered wait"
    assert all(0 <= w <= BEST_EFFORT.max_wait for w in waits)
    assert "could not record the failure in s3://nowhere/remap" in caplog.text


def test_a_recorded_failure_reads_back(tmp_path: Path) -> None:
    url = (tmp_path / "remap").as_uri()
    assert health.record_failure(url, "boom") is True
    got = health.read(url)
    assert got is not None and (got["status"], got["error"]) == ("failing", "boom")
