"""Spark for the sink tests: the same session as tests/spark (``local_spark`` reuses it); and a
count of fate decisions for the each-fact-read-once tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from shardsink.core import fate as ft
from shardsink_dev.testing import MotoServer, local_spark


@pytest.fixture(scope="session")
def spark(moto: MotoServer) -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture
def fates(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each description's fate was decided (the real rule runs; this only counts)."""
    seen: Counter[str] = Counter()
    real = ft.decide

    def counting(ev: ft.Evidence, desc_id: str, lower: int) -> ft.Fate:
        seen[desc_id] += 1
        return real(ev, desc_id, lower)

    monkeypatch.setattr(ft, "decide", counting)
    return seen
