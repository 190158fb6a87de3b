"""Real Airflow for the DAG tests: one migrated SQLite DB per session, copied per test.

Every test gets its own AIRFLOW_HOME (a copy of the template DB), its own landing zone
and shard, and runs the repo's real DAG files with ``airflow dags test`` (or a real
scheduler) in subprocesses, with real spark-submit at local[2].
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from af_helpers import VENV_BIN, Env, base_env, make_env

from shardsink_dev import dagrunner
from shardsink_dev.connect import ConnectServer


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


@pytest.fixture(scope="session")
def connect_engine(connect_service: ConnectServer) -> dict[str, str]:
    """The environment that makes the example DAGs' write jobs client sessions of the test
    process's one Spark Connect server (tests/conftest.py ``connect_service``):
    ``SHARDSINK_ENGINE=connect`` and its ``spark_connect_default`` connection. A write slot then
    costs a session, not a spark-submit's JVMs."""
    return {"SHARDSINK_ENGINE": "connect", "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_service.airflow_connection()}


@pytest.fixture(autouse=True)
def _stop_warm_dags_test_runners() -> Iterator[None]:
    """Every test's warm ``dags test`` processes stop with it (they hold its Airflow home)."""
    yield
    dagrunner.close_all()
