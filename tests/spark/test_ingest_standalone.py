"""The ingest write job on a real Spark standalone cluster (master + worker from the pyspark wheel).

Executors run in the worker's own JVM and Python processes, so this proves the job ships
everything it needs (--py-files zip built by shardsink) and uploads parts from executors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardsink import Shard
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import append_from_manifests, mint_chain, open_or_create
from shardsink.sources import source_spec
from shardsink.sources.landing import LandingSource
from shardsink.spark import build_pyfiles_zip, job_path
from shardsink.spark.request import IngestWriteRequest, job_argv
from shardsink_dev import jvm
from shardsink_dev.synthetic import generate
from shardsink_dev.testing import free_port

BIN = Path(sys.executable).parent
START = 1_704_067_200_000
DAY = 86_400_000


#: Short-lived JVMs (launcher, driver, executor) start faster with the suite's flags and class-data
#: archives (shardsink_dev/jvm.py); the long-lived master and worker get the flags alone.
JVM_OPTS = jvm.BASE_OPTS


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "SPARK_LOG_DIR": str(tmp),
            "SPARK_WORKER_DIR": str(tmp / "work"), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_SUBMIT_OPTS": jvm.submit_opts(), "SPARK_LAUNCHER_OPTS": jvm.launcher_opts(),
            "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    # Three distinct ports: free_port releases its socket, so two calls can return the same port
    # (once /json/ on the master's UI port answered with an HTML page).
    ports: list[int] = []
    while len(ports) < 3:
        candidate = free_port()
        if candidate not in ports:
            ports.append(candidate)
    port, ui, worker_ui = ports
    env = _env(tmp_path)
    cls = "org.apache.spark.deploy"
    procs = [subprocess.Popen([str(BIN / "spark-class"), f"{cls}.master.Master", "--host", "127.0.0.1", "--port",
                               str(port), "--webui-port", str(ui)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    master = f"spark://127.0.0.1:{port}"
    procs.append(subprocess.Popen([str(BIN / "spark-class"), f"{cls}.worker.Worker", master, "--host", "127.0.0.1",
                                   "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                state = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2).read())
                if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
                    break
            except (OSError, ValueError):  # not up yet, or a page that is not the JSON status yet
                pass
            assert time.monotonic() < deadline, "the standalone worker did not register"
            time.sleep(0.5)
        yield master
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def test_write_job_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    """One writer slot: what this proves (the job ships its code, executors in the worker upload
    parts) does not depend on the slot count, and each slot costs a driver and an executor JVM.
    Several slots per description are covered in-process (tests/sinks) and under Airflow."""
    landing = str(tmp_path / "landing")
    generate(landing, start=START, days=1, files_per_day=3, rows_per_file=100)
    src = LandingSource(landing)
    shard = open_or_create((tmp_path / "shard").as_uri(), src, initial_upper=START)
    chain = mint_chain(shard, src, interval_end=START + DAY, max_span=None, max_chain=1, dag_id="standalone",
                       run_id="r", attempt=1)
    assert isinstance(chain, list)
    d = chain[0]
    assert isinstance(d, Description)
    slots = 1
    for slot in range(slots):
        r = subprocess.run([str(BIN / "spark-submit"), "--master", cluster, "--conf", "spark.ui.enabled=false",
                            "--conf", "spark.executor.memory=512m",
                            "--conf", f"spark.executor.extraJavaOptions={jvm.submit_opts()}",
                            "--py-files", build_pyfiles_zip(tmp_path / "zip"),
                            job_path(), *job_argv(IngestWriteRequest(shard_url=shard.url, source=source_spec(src),
                                                                     desc=d, slot=slot, slots=slots))],
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        assert "SHARDSINK_WRITE" in r.stdout
    # executors ran in the worker (its work dir holds the app's executor folders)
    assert any((tmp_path / "work").glob("app-*/*/stderr"))
    res = append_from_manifests(shard, d, slots)
    assert res.status == "committed" and res.rows == 300
    assert sum(Shard.open(shard.url).changes(START, START + DAY)["_diff"].to_pylist()) == 300
