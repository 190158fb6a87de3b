"""The production topology for the tests under tests/topology (see topo_stack.py).

``topology`` is session-scoped: one PostgreSQL, Redis, Spark standalone cluster and
CeleryExecutor Airflow serve every test here; tests keep apart by their own DAG ids
(module-level constants) and shard URLs (fresh prefixes in the moto bucket).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from topo_stack import Topology, topology_stack

from shardsink_dev.testing import MotoServer


@pytest.fixture(scope="session")
def topology(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A running production topology (PostgreSQL, Redis, CeleryExecutor Airflow with two workers,
    Spark master + two workers, moto S3). Interface: :class:`topo_stack.Topology`."""
    with topology_stack(tmp_path_factory.mktemp("topology")) as topo:
        yield topo
