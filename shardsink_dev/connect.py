"""A local Spark Connect server for tests, benchmarks and ``make connect``.

Started from the venv's pip ``pyspark`` (which ships the server jar but no
``start-connect-server.sh``): ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
on ``local[N]``, its Python workers on this interpreter with the ``plugins`` folder on their
``PYTHONPATH`` (so they import this checkout's shardsink). Settings that make a client session cheap:

* ``spark.sql.artifact.isolation.enabled=false`` (sessions add no artifacts). Sessions still do
  not share a Python worker daemon: each session's jobs carry their own artifact id, and the
  server starts one daemon per session;
* ``spark.python.daemon.module=shardsink.spark.daemon``: each session's Python worker daemon
  is forked from the server's one worker fork server (shardsink/spark/forkserver.py), which
  imported pyarrow, pandas, pyspark's worker and shardsink once, so its workers fork warm
  (0.72x the server's CPU per session, bench/daemon_cost.py), and imports the venv's pyspark
  (bytecode cached) instead of Spark's ``pyspark.zip`` (compiled from source by every daemon);
* Python's compiled bytecode is cached under ``PYCACHE`` (``PYTHONPYCACHEPREFIX``), also when
  the caller's environment sets ``PYTHONDONTWRITEBYTECODE``: a worker that compiles pyarrow
  and pyspark from source costs seconds of CPU.

The event log (uncompressed, one file) records every session's start and close:
:meth:`ConnectServer.open_sessions` reads it to count sessions never released.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shardsink.spark.daemon import DAEMON_MODULE
from shardsink_dev.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
PYCACHE = os.path.join(tempfile.gettempdir(), "shardsink-pycache")
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def python_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with bytecode cached under :data:`PYCACHE`."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    return env


@dataclass
class ConnectServer:
    """A running server: its ``url`` (``sc://127.0.0.1:PORT``), process and folders."""

    port: int
    folder: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.folder / "server.log"

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def airflow_connection(self) -> str:
        """The server as an Airflow ``spark_connect`` connection (JSON: ``AIRFLOW_CONN_*`` or
        ``airflow connections add --conn-json``)."""
        return json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.port})

    def start(self, *, timeout: float = 180.0) -> None:
        """Start the server and wait until it accepts sessions (its log says so)."""
        (self.folder / "events").mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()
        mark = f":{self.port}\n"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log_path.read_text(errors="replace")
            if any("Spark Connect server started at" in line and line.endswith(mark[:-1])
                   for line in log.splitlines()[-200:]):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the Spark Connect server did not start in {timeout} s ({self.log_path})")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (its whole process group: the JVM and its Python workers)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def restart(self, *, kill: bool = True) -> None:
        """Kill (default) or stop the server, then start it again on the same port."""
        self.stop(kill=kill)
        self.start()

    def open_sessions(self) -> set[str]:
        """Session ids the server started and has not closed, from its event log (all runs)."""
        started: set[str] = set()
        closed: set[str] = set()
        for path in (self.folder / "events").glob("*"):
            for line in path.read_text(errors="replace").splitlines():
                if "ConnectSession" not in line:
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a line being written
                kind, sid = str(ev.get("Event", "")), str(ev.get("sessionId", ""))
                if kind.endswith("SparkListenerConnectSessionStarted"):
                    started.add(sid)
                elif kind.endswith("SparkListenerConnectSessionClosed"):
                    closed.add(sid)
        return started - closed


def server_argv(port: int, folder: Path, *, cores: int = 2, driver_memory: str = "1g") -> list[str]:
    """The spark-submit command line of a local server (module docstring)."""
    bin_dir = Path(sys.executable).parent
    return [str(bin_dir / "spark-submit"), "--master", f"local[{cores}]", "--class", SERVER_CLASS,
            "--driver-memory", driver_memory,
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", "spark.sql.shuffle.partitions=2", "--conf", f"spark.default.parallelism={cores}",
            "--conf", "spark.sql.session.timeZone=UTC",
            "--conf", "spark.sql.artifact.isolation.enabled=false",
            "--conf", f"spark.python.daemon.module={DAEMON_MODULE}",
            "--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
            "--conf", "spark.eventLog.rolling.enabled=false",
            "--conf", f"spark.eventLog.dir=file://{folder / 'events'}"]


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: Python workers on this interpreter, importing ``plugins/``."""
    env = python_env(base)
    plugins = str(ROOT / "plugins")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [plugins, env.get("PYTHONPATH", "")] if p)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@contextmanager
def connect_server(*, port: int | None = None, cores: int = 2, folder: str | os.PathLike[str] | None = None,
                   env: dict[str, str] | None = None) -> Iterator[ConnectServer]:
    """A local Spark Connect server for the block (module docstring); stopped on the way out.

    ``env``: the environment to start from (default: this process's; set ``AWS_ENDPOINT_URL``
    etc. first, the server's workers inherit it)."""
    where = Path(tempfile.mkdtemp(prefix="shardsink-connect-")) if folder is None else Path(folder)
    for tries_left in (2, 1, 0):
        at = port or free_port()
        server = ConnectServer(port=at, folder=where, argv=server_argv(at, where, cores=cores), env=server_env(env))
        try:
            server.start()
            break
        except RuntimeError:
            # SUBTLE: a port free_port saw free can be taken before the server binds it (the
            # service does not move to another port): pick another, unless the caller chose it.
            if port is not None or not tries_left or "BindException" not in server.log_path.read_text(errors="replace"):
                raise
    try:
        yield server
    finally:
        server.stop()


def warm_up(server: ConnectServer) -> float:
    """One session as a write slot's: the Python check (the session's worker daemon) and a
    few rows written by Spark's Parquet writer into the server's folder; returns its seconds.

    A freshly started server's first write loads and compiles the writer's classes: 7.7 s for
    the demo's first 900-row slot against 0.3-2.2 s for the next ones (README, write engines).
    Runs in a child process: a Connect client marks its whole process as one (connect.py)."""
    code = ("import sys, pyarrow as pa\n"
            "from shardsink.spark.connect import connect_session\n"
            "with connect_session(sys.argv[1], name='shardsink-warm-up') as spark:\n"
            "    t = pa.table({'k': list(range(100)), 'v': [str(i) for i in range(100)]})\n"
            "    spark.createDataFrame(t).write.mode('overwrite').parquet(sys.argv[2])\n")
    t0 = time.monotonic()
    env = server_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "plugins"), str(ROOT), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code, server.url, str(server.folder / "warm-up")], env=env,
                   check=True, capture_output=True, timeout=300)
    return time.monotonic() - t0


def main() -> int:
    """``make connect``: run a local server in the foreground until interrupted."""
    import argparse

    p = argparse.ArgumentParser(prog="shardsink-connect", description="run a local Spark Connect server")
    p.add_argument("--port", type=int, default=15002)
    p.add_argument("--cores", type=int, default=2)
    a = p.parse_args()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too stops the server (its own session outlives this process)
    signal.signal(signal.SIGTERM, interrupted)
    with connect_server(port=a.port, cores=a.cores) as server:
        print(f"warming up (one small write session): {warm_up(server):.1f} s", flush=True)
        print(f"Spark Connect server at {server.url} (log {server.log_path}); Ctrl-C stops it", flush=True)
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
