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


@pytest.fixture(scope="module")
def connect(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The one Spark Connect server of the test run (``local[2]``, shardsink_dev.connect), started
    after the moto server so its JVM and Python workers inherit ``AWS_ENDPOINT_URL``; every
    Connect test (all in tests/spark/test_connect.py) is a client session of it (no JVM per test).
    Module scope: the server stops when that module ends, not at the end of the whole run."""
    from shardsink_dev.connect import connect_server

    with connect_server(folder=tmp_path_factory.mktemp("connect")) as server:
        yield server
