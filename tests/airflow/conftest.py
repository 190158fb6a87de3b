"""Real Airflow for the DAG tests: one migrated SQLite DB per session, copied per test.

Every test gets its own AIRFLOW_HOME (a copy of the template DB), its own landing zone
and shard, and runs the repo's real DAG files with ``airflow dags test`` (or a real
scheduler) in subprocesses, with real spark-submit at local[2].
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from af_helpers import VENV_BIN, Env, base_env, make_env

from shardsink_dev import dagrunner


@pytest.fixture(scope="session")
def airflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated Airflow DB, made once per session (``airflow db migrate``)."""
    home = tmp_path_factory.mktemp("airflow-template")
    r = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=base_env(home), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return home / "airflow.db"


@pytest.fixture
def af(tmp_path: Path, airflow_template: Path) -> Iterator[Env]:
    yield make_env(tmp_path, airflow_template)


_connect = ExitStack()


@pytest.fixture(scope="session")
def connect_engine(moto: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment that makes the example DAGs' write jobs client sessions of one Spark Connect
    server (``SHARDSINK_ENGINE=connect`` and its ``spark_connect_default`` connection), the server
    started once for the test process (``local[2]``, shardsink_dev.connect), after the moto server
    (its Python workers reach S3 shards there): a write slot then costs a session, not a
    spark-submit's JVMs. It stops after the last test that uses it
    (:func:`pytest_runtest_teardown`), not with the session: an idle server burns CPU."""
    from shardsink_dev.connect import connect_server

    with _connect:
        server = _connect.enter_context(connect_server(folder=tmp_path_factory.mktemp("connect")))
        yield {"SHARDSINK_ENGINE": "connect", "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": server.airflow_connection()}


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the run that uses :func:`connect_engine`: stop its server."""
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    if not any("connect_engine" in getattr(i, "fixturenames", ()) for i in later):
        _connect.close()


@pytest.fixture(autouse=True)
def _stop_warm_dags_test_runners() -> Iterator[None]:
    """Every test's warm ``dags test`` processes stop with it (they hold its Airflow home)."""
    yield
    dagrunner.close_all()
