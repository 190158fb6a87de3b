"""Helpers for tests and benchmarks: a real S3 endpoint (moto) on 127.0.0.1.

Not used by the library itself. The server runs as a separate OS process so that
clients measured against it do not share its interpreter lock.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Credentials moto accepts; fake by construction.
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class MotoServer:
    endpoint: str
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """Environment that points boto3 (and shardsink) at this server."""
        return {**FAKE_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def make_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=FAKE_ENV["AWS_DEFAULT_REGION"],
        )
        client.create_bucket(Bucket=name)


@contextmanager
def moto_server(port: int | None = None) -> Iterator[MotoServer]:
    """Start ``moto_server`` on 127.0.0.1 in a child process; stop it on exit.

    SUBTLE: with no ``port`` the child binds one the system picks (``-p 0``) and the endpoint
    is the port it logs: a port seen free beforehand can be taken by another process (another
    test process's moto, even) before the child binds it, and a probe would then find the
    other server answering."""
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "moto.server"]
    log = tempfile.NamedTemporaryFile(prefix="shardsink-moto-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port or 0)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **FAKE_ENV})
    log.close()
    deadline = time.monotonic() + 30
    while True:
        bound = re.search(r"Running on http://127\.0\.0\.1:(\d+)", Path(log.name).read_text(errors="replace"))
        if bound is not None:
            endpoint = f"http://127.0.0.1:{bound.group(1)}"
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
                break
            except OSError:
                pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = Path(log.name).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"moto server did not start on port {port or 0}: {tail}") from None
        time.sleep(0.1)
    try:
        yield MotoServer(endpoint, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


@contextmanager
def local_spark(app: str = "shardsink-test", *, partitions: int = 4) -> Iterator[Any]:
    """A ``local[2]`` SparkSession for tests and benchmarks (UI off, UTC, few shuffle partitions).

    Workers run this interpreter (``PYSPARK_PYTHON``), so ``shardsink`` and pyarrow are
    importable there. The JVM inherits the environment *now*: set ``AWS_ENDPOINT_URL``
    (e.g. :meth:`MotoServer.env`) before calling. Reuses an active session if there is
    one and then leaves it running.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shardsink.spark.daemon import daemon_conf  # the workers import pyspark and shardsink once

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    daemon: dict[str, Any] = daemon_conf({}, master="local[2]", worker_python=os.environ["PYSPARK_PYTHON"])
    spark = (
        SparkSession.builder.master("local[2]").appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config(map=daemon)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
