"""Helpers of the Airflow tests: environments, running `airflow dags test`, exactly-once checks.

Every test gets its own AIRFLOW_HOME (a copy of the template DB), its own landing zone
and shard, and runs the repo's real DAG files with ``airflow dags test`` (or a real
scheduler) in subprocesses, with real spark-submit at local[2].
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardsink import Shard
from shardsink.core.updates import DIFF, TIME
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev import dagrunner, jvm

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
START = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1000)
DAY = 86_400_000
#: JVM flags of long-lived test JVMs (Spark daemons); spark-submits get :func:`jvm.submit_opts` too.
JVM_OPTS = jvm.BASE_OPTS


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type":"spark","host":"local[2]"}',
        "PYTHONWARNINGS": "ignore",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SHARDSINK_TASK_RETRY_DELAY_S": "1",
        "SHARDSINK_RETRY_BACKOFF": "0.2",
        # Every spark-submit starts two short-lived JVMs (the launcher, then the driver), and
        # most of their CPU goes to JIT compilation, a parallel GC sized for a big heap and
        # loading Spark's classes: C1, the serial GC and the class-data archives halve a
        # trivial job's CPU on these 2 cores (shardsink_dev/jvm.py); they change how fast the
        # JVM is, never what it computes.
        "SPARK_SUBMIT_OPTS": jvm.submit_opts(),
        "SPARK_LAUNCHER_OPTS": jvm.launcher_opts(),
    })
    return env


@dataclass
class Env:
    """One test's Airflow home, landing zone and shard, plus helpers to run and check."""

    home: Path
    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def landing(self) -> str:
        return self.env["SHARDSINK_LANDING"]

    @property
    def shard_url(self) -> str:
        return self.env["SHARDSINK_SHARD"]

    def dags_test(self, logical_date: str, *, extra: dict[str, str] | None = None, timeout: float = 400,
                  home: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **(extra or {})}
        if home is not None:
            env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"})
        return dagrunner.dags_test(env, env.get("SHARDSINK_DAG_ID", "example_ingest"), logical_date,
                                        timeout=timeout)

    def popen_dags_test(self, logical_date: str, *, log: Path, extra: dict[str, str] | None = None,
                        home: Path | None = None) -> subprocess.Popen[str]:
        """``airflow dags test`` in the background, its output going to the file ``log``.

        SUBTLE: not to a pipe: nobody reads a pipe while the test waits for the run to reach
        a point, and a full pipe buffer (64 KB of task logs) blocks the run forever.
        """
        env = {**self.env, **(extra or {})}
        if home is not None:
            env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"})
        with open(log, "w") as out:  # the child keeps its own descriptor
            return subprocess.Popen([str(VENV_BIN / "airflow"), "dags", "test", "example_ingest", logical_date],
                                    env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def asset_events(self, home: Path | None = None) -> list[dict[str, Any]]:
        db = (home or self.home) / "airflow.db"
        with sqlite3.connect(db) as c:
            rows = c.execute("SELECT extra FROM asset_event ORDER BY id").fetchall()
        return [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]


def make_env(tmp_path: Path, template: Path, name: str = "ah") -> Env:
    home = tmp_path / name
    home.mkdir()
    shutil.copy(template, home / "airflow.db")
    root = tmp_path / "data"
    env = base_env(home)
    env.update({"SHARDSINK_DEMO_ROOT": str(root), "SHARDSINK_LANDING": str(root / "landing"),
                "SHARDSINK_SHARD": (root / "shards" / "events").as_uri()})
    return Env(home, root, env)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    return out


@contextmanager
def airflow_stack(env: dict[str, str]) -> Iterator[None]:
    """api-server (execution API only), scheduler, dag-processor and triggerer; stopped on exit.

    The triggerer runs the deferred waits of the mint tasks (:mod:`shardsink.airflow.triggers`):
    without one a waiting run stays ``deferred`` forever."""
    logs = env["AIRFLOW_HOME"]
    procs = []
    try:
        for name, args in (("api", ["api-server", "--port", env["_API_PORT"], "--workers", "1", "--apps", "execution"]),
                           ("scheduler", ["scheduler", "--skip-serve-logs"]),
                           ("dag-processor", ["dag-processor"]),
                           ("triggerer", ["triggerer", "--skip-serve-logs"])):
            out = open(f"{logs}/{name}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen([str(VENV_BIN / "airflow"), *args], env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True), out))
        url = f"http://127.0.0.1:{env['_API_PORT']}/execution/health"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("api-server did not become healthy") from None
                time.sleep(0.5)  # not ordering: the api-server's readiness, bounded by the deadline
        yield
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p, out in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.close()


# --- lineage and metrics capture -------------------------------------------------------------


def lineage_env(path: Path) -> dict[str, str]:
    """Airflow settings making the OpenLineage provider append every event to ``path`` (JSON lines)."""
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(path),
                                                          "append": True}),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "shardsink-test"}


def read_lineage(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def lineage_events(events: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The events of the OpenLineage job ``job`` (``<dag_id>.<task_id>``)."""
    return [e for e in events if e.get("job", {}).get("name") == job]


class UdpListener:
    """A StatsD server stand-in: every datagram received on 127.0.0.1:port, as text lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(data.decode(errors="replace").splitlines())

    def env(self) -> dict[str, str]:
        """Airflow settings sending its metrics (and shardsink's) here."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port)}

    def metrics(self, prefix: str = "airflow.shardsink.") -> list[tuple[str, str]]:
        """(name, ``value|type``) of every datagram line whose name starts with ``prefix``, in arrival order."""
        return [(ln.split(":", 1)[0], ln.split(":", 1)[1]) for ln in self.lines if ln.startswith(prefix) and ":" in ln]

    def close(self) -> None:
        """Stop listening, keeping every datagram already sent: on loopback a datagram is in this
        socket's queue once its ``sendto`` returned, so a process that exited has none in flight."""
        self._stop.set()
        self.sock.sendto(b"", self.sock.getsockname())  # wakes the thread's recv now
        self._thread.join(timeout=5)
        self.sock.setblocking(False)
        with suppress(BlockingIOError):
            while True:
                self.lines.extend(self.sock.recv(65535).decode(errors="replace").splitlines())
        self.sock.close()


# --- checks ---------------------------------------------------------------------------------


def source_updates(landing: str, lower: int, upper: int) -> pa.Table:
    """The landing zone's rows in [lower, upper) as consolidated updates (what the shard must hold)."""
    src = LandingSource(landing)
    schema = src.schema()
    assert schema is not None
    blob = src.blob()
    tables = [read_landing_file(blob, f, schema, "event_time") for f in src.files()]
    t = pa.concat_tables(tables)
    t = t.filter(pc.and_(pc.greater_equal(t[TIME], lower), pc.less(t[TIME], upper)))
    return _counts(t.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), t.num_rows)))


def _counts(t: pa.Table) -> list[tuple[Any, ...]]:
    keys = [c for c in t.column_names if c != DIFF]
    g = t.group_by(keys).aggregate([(DIFF, "sum")])
    return sorted(tuple(r.values()) for r in g.select([*keys, f"{DIFF}_sum"]).to_pylist())


def assert_exactly_once(shard_url: str, landing: str, lower: int, upper: int) -> None:
    """The shard's updates in [lower, upper) equal the source's rows there, each exactly once."""
    shard = Shard.open(shard_url)
    got = _counts(shard.changes(lower, upper))
    want = source_updates(landing, lower, upper)
    assert len(got) == len(want) and got == want, f"shard has {len(got)} distinct updates, source {len(want)}"


def assert_no_leaks(shard_url: str) -> None:
    """Every object under parts/ is referenced by a committed batch; staging/ is empty."""
    shard = Shard.open(shard_url)
    referenced = {p.key for b in shard.batches() for p in b.parts}
    present = {o.key for o in shard._machine.blob.list("parts/")}
    leaked, missing = sorted(present - referenced)[:5], sorted(referenced - present)[:5]
    assert present == referenced, f"leaked {leaked}, missing {missing}"
    assert not list(shard._machine.blob.list("staging/")), "staging manifests left behind"
