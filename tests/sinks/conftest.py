"""Spark for the sink tests: the same session as tests/spark (``local_spark`` reuses it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardsink_dev.testing import MotoServer, local_spark


@pytest.fixture(scope="session")
def spark(moto: MotoServer) -> Iterator[Any]:
    with local_spark() as session:
        yield session
