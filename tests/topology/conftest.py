"""The production topology for the tests under tests/topology (see topo_stack.py).

``topology`` is one stack for every test here: one PostgreSQL, Redis, Spark standalone cluster
and CeleryExecutor Airflow; tests keep apart by their own DAG ids (module-level constants) and
shard URLs (fresh prefixes in the moto bucket). It stops as soon as the last test here ends, not
with the pytest session: ``make test`` runs these tests first in their group, and the idle stack
(scheduler loop, Celery, Spark heartbeats) burned CPU for the rest of the group. (A package-scoped
fixture would not do: this folder is no package, and pytest then tears it down at session end.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from topo_stack import Topology, topology_stack

from shardsink_dev.connect import ConnectServer
from shardsink_dev.testing import MotoServer

HERE = Path(__file__).resolve().parent
_stack = ExitStack()


@pytest.fixture(scope="session")
def topology(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A running production topology (PostgreSQL, Redis, CeleryExecutor Airflow with two workers,
    Spark master + two workers, moto S3). Interface: :class:`topo_stack.Topology`."""
    with _stack:
        yield _stack.enter_context(topology_stack(tmp_path_factory.mktemp("topology")))


@pytest.fixture(scope="session")
def connect_conn(topology: Topology, connect_service: ConnectServer) -> str:
    """The test process's one Spark Connect server (tests/conftest.py ``connect_service``,
    ``local[2]``; its Python workers reach the moto store as the stack does) for the write slots
    of DAGs with ``SparkOptions(engine="connect")``, registered as the Airflow connection
    ``spark_connect_default`` in the stack's metadata database (the Celery workers read it
    there). The server is shared with the other tests of the process that use one and stops
    after the last of them (tests/conftest.py); the connection goes with the stack."""
    r = topology.airflow("connections", "add", "spark_connect_default", "--conn-json",
                         connect_service.airflow_connection())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return connect_service.url


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test here (the next one is elsewhere, or none): stop the stack."""
    if nextitem is None or Path(nextitem.path).resolve().parent != HERE:
        _stack.close()
