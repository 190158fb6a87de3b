"""Shared fixtures: a moto S3 server over real HTTP, and a backend fixture that runs
the same contract tests against the local folder and S3."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest

from shardsink.storage import Blob, open_blob, parse_url
from shardsink.storage.s3 import S3Blob, make_client
from shardsink_dev import jvm
from shardsink_dev.testing import MotoServer, moto_server

if TYPE_CHECKING:
    from shardsink_dev.connect import ConnectServer

BUCKET = "shardsink-test"

# The JVMs this test run starts (the shared SparkSessions' drivers and every spark-submit of a
# subprocess, which inherit the environment): the client (C1) compiler, the serial GC and, once
# `make test` has built them, the class-data archives of Spark's classes (shardsink_dev/jvm.py).
# Most of a short test JVM's CPU goes to JIT compilation, a parallel GC sized for a big heap and
# loading Spark's classes; these change how fast the JVM is, never what it computes. A caller's
# own settings win.
os.environ.setdefault("SPARK_SUBMIT_OPTS", jvm.submit_opts())
os.environ.setdefault("SPARK_LAUNCHER_OPTS", jvm.launcher_opts())


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with moto_server() as server:
        server.make_bucket(BUCKET)
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def shard_url(backend: str, tmp_path: object, request: pytest.FixtureRequest) -> str:
    """A fresh, not-yet-created shard URL on the parametrised backend."""
    name = f"shard-{uuid.uuid4().hex[:12]}"
    if backend == "local":
        return f"file://{tmp_path}/{name}"
    request.getfixturevalue("moto")
    return f"s3://{BUCKET}/{name}"


@pytest.fixture(scope="session")
def s3_client(moto: MotoServer) -> Any:
    """One boto3 client for the session (creating one costs ~0.3 s); fixtures share it."""
    return make_client()


@pytest.fixture
def blob(shard_url: str, request: pytest.FixtureRequest) -> Blob:
    """The backend of ``shard_url``; fresh Shard handles on it share nothing but the store."""
    u = parse_url(shard_url)
    if u.scheme == "s3":
        return S3Blob(u.bucket, u.path, client=request.getfixturevalue("s3_client"))
    return open_blob(u)


_connect = ExitStack()
_LAST_CONNECT_USER = pytest.StashKey[str | None]()


@pytest.fixture(scope="session")
def connect_service(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """ONE Spark Connect server for the whole test process (``local[2]``, shardsink_dev.connect),
    shared by every fixture that sends write jobs there (tests/airflow's ``connect_engine``,
    tests/topology's ``connect_conn``): starting one, and its first sessions' warm-up, costs
    tens of CPU-s, so a test process starts at most one. Started after the moto server, whose
    settings are then in ``os.environ``: the server inherits them, so its Python workers reach the
    S3 shards there. It stops after the last test of the run that uses it
    (:func:`pytest_runtest_teardown`), not with the session: it and its sessions' Python worker
    daemons hold memory and some CPU while the rest of the run goes on."""
    from shardsink_dev.connect import connect_server

    with _connect:
        yield _connect.enter_context(connect_server(folder=tmp_path_factory.mktemp("connect")))


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the run that uses :func:`connect_service` (directly or through
    another fixture): stop its server. The last user is found once per session."""
    stash = item.session.stash
    if _LAST_CONNECT_USER not in stash:
        users = [i.nodeid for i in item.session.items if "connect_service" in getattr(i, "fixturenames", ())]
        stash[_LAST_CONNECT_USER] = users[-1] if users else None
    if item.nodeid == stash[_LAST_CONNECT_USER]:
        _connect.close()
