"""The one SparkSession of the test run (local[2], UI off), started after the moto server
so that the JVM and its Python workers inherit ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardsink_dev.testing import MotoServer, local_spark


@pytest.fixture(scope="session")
def spark(moto: MotoServer) -> Iterator[Any]:
    with local_spark() as session:
        yield session
