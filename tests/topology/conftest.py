"""The production topology for the tests under tests/topology (see topo_stack.py).

``topology`` is package-scoped: one PostgreSQL, Redis, Spark standalone cluster and
CeleryExecutor Airflow serve every test here; tests keep apart by their own DAG ids
(module-level constants) and shard URLs (fresh prefixes in the moto bucket). It stops when
the last test here ends, not with the pytest session: ``make test`` runs these tests first in
their group, and the idle stack (scheduler loop, DAG parsing, Celery, Spark heartbeats) burned
CPU for the rest of the group (the whole stack: 604 s of CPU in a 22-minute group).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from topo_stack import Topology, topology_stack

from shardsink_dev.testing import MotoServer


@pytest.fixture(scope="package")
def topology(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A running production topology (PostgreSQL, Redis, CeleryExecutor Airflow with two workers,
    Spark master + two workers, moto S3). Interface: :class:`topo_stack.Topology`."""
    with topology_stack(tmp_path_factory.mktemp("topology")) as topo:
        yield topo
