"""The production topology on one host, for the tests under tests/topology.

What runs (every process started by :func:`topology_stack`, on 127.0.0.1 and free ports):

* **PostgreSQL** (Debian's, ``initdb`` in a temporary folder owned by the ``postgres`` user
  when we are root): Airflow's metadata DB and the Celery result backend;
* **Redis**: the Celery broker;
* **Airflow** with the CeleryExecutor: ``api-server`` (REST + execution API), ``scheduler``,
  ``dag-processor``, ``triggerer`` and TWO ``airflow celery worker`` processes. Each worker
  stands for a machine: its own Celery node name, log-server port and Airflow hostname
  (``[core] hostname_callable`` reads ``TOPOLOGY_HOSTNAME``), so a task instance's
  ``hostname`` names the worker that ran it;
* **Spark** standalone (connection ``spark_default``): a master and two workers (1 GiB, 2 cores each). spark-submit
  in the Celery workers gets the cluster's defaults as ``-Dspark.*`` properties in ``SPARK_SUBMIT_OPTS``
  (topo_spark.py): small executors (512m, one core, ``spark.cores.max`` 1), UI off, event logs in
  :attr:`Topology.spark_events`;
* **S3**: the session's moto server (tests/conftest.py ``moto``, bucket ``shardsink-test``).

SUBTLE: every daemon gets its own process group (``start_new_session``) and is stopped by
group, so the JVMs a Spark worker forks for executors and the spark-submits a Celery worker
runs die with it; PostgreSQL is stopped with ``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from topo_spark import bound_master, spark_defaults, start_spark

from shardsink_dev.testing import free_port
from tests.airflow.af_helpers import VENV_BIN, base_env

T = TypeVar("T")
ADMIN = ("admin", "topology-admin-pw-5772")
WORKERS = ("worker-1.topology", "worker-2.topology")  # the two Celery "machines"' hostnames
TERMINAL = ("success", "failed")

HOSTNAME_MODULE = '''
"""Airflow's [core] hostname_callable in the topology: each Celery worker plays a machine."""
import os, socket
def hostname() -> str:
    return os.environ.get("TOPOLOGY_HOSTNAME") or socket.getfqdn()
'''


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float, every: float = 1.0,
              log: Path | None = None) -> T:
    """``probe()`` until it returns a value that is not None (``OSError`` counts as None)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = probe()
        except OSError:
            got = None
        if got is not None:
            return got
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
            raise AssertionError(f"{what}: not within {timeout:.0f}s\n{tail}")
        time.sleep(every)  # not ordering: a poll of foreign servers (no event to wait on), bounded by timeout


def get_json(url: str, *, headers: dict[str, str] | None = None, timeout: float = 30) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
        return json.loads(r.read())


class Daemons:
    """Processes in their own process groups, logging to ``<logs>/<name>.log``; stopped in reverse order."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as out:  # the child keeps its own descriptor
            p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p))
        return p

    def check(self) -> None:
        """Fail naming any daemon that exited (with its log's tail)."""
        for name, p in self.procs:
            if p.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} exited with {p.returncode}:\n{tail}")

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            with suppress(ProcessLookupError):  # children left in the group (executors, task processes)
                os.killpg(p.pid, signal.SIGKILL)


@dataclass
class Topology:
    """A running topology (module docstring). Stable interface for tests/topology/*:

    * ``env``: the Airflow processes' environment (PostgreSQL, Celery, AWS, the Spark connection
      ``spark_default``: the standalone cluster);
    * ``dags``: the DAG folder (empty at start): :meth:`add_dag_file` then :meth:`wait_for_dags`;
    * :meth:`airflow` runs an Airflow CLI command; :meth:`api` calls the REST API as an admin;
    * :meth:`unpause`, :meth:`trigger`, :meth:`runs`, :meth:`wait_for_runs`, :meth:`task_instances`,
      :meth:`task_log`;
    * ``workers``: the Celery workers' hostnames; :meth:`spark_workers`, :meth:`spark_apps`
      read Spark's own records (the master's and workers' JSON, the event logs).
    """

    root: Path
    env: dict[str, str]
    api_url: str
    spark_master_ui: str
    spark_worker_uis: tuple[str, ...]
    spark_events: Path
    daemons: Daemons
    workers: tuple[str, ...] = WORKERS
    _token: str | None = field(default=None, repr=False)

    @property
    def dags(self) -> Path:
        return Path(self.env["AIRFLOW__CORE__DAGS_FOLDER"])

    # --- Airflow ------------------------------------------------------------------------------

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``airflow ARGS`` against the topology (a CLI process of its own, like an operator's)."""
        return subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """The REST API (``/api/v2`` + ``path``) as the admin user; JSON in, JSON out. HTTPError on failure."""
        if self._token is None:
            req = urllib.request.Request(f"{self.api_url}/auth/token", method="POST",
                                         data=json.dumps({"username": ADMIN[0], "password": ADMIN[1]}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                self._token = json.loads(r.read())["access_token"]
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.api_url}/api/v2{path}", method=method, data=data,
                                     headers={"Authorization": f"Bearer {self._token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def add_dag_file(self, name: str, source: str) -> Path:
        """Write a DAG file into the DAG folder (the dag-processor finds it within seconds)."""
        path = self.dags / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(source)
        tmp.rename(path)  # never half a file for the dag-processor
        return path

    def wait_for_dags(self, *dag_ids: str, timeout: float = 180) -> None:
        """Until every DAG is parsed and serialized (the REST API knows it)."""
        def known() -> bool | None:
            self.daemons.check()
            for d in dag_ids:
                try:
                    self.api("GET", f"/dags/{d}")
                except urllib.error.HTTPError as e:
                    if e.code == 404:
                        return None
                    raise
            return True
        wait_for(f"DAGs {dag_ids} parsed", known, timeout=timeout, every=2,
                 log=self.root / "logs" / "dag-processor.log")

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """A manual run (no logical date); returns its run id."""
        return str(self.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
                   ["dag_run_id"])

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.api("GET", f"/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"])

    def wait_for_runs(self, dag_id: str, *, at_least: int, timeout: float,
                      done: Callable[[list[dict[str, Any]]], bool] | None = None) -> list[dict[str, Any]]:
        """Until ``dag_id`` has ``at_least`` runs, all finished (and ``done(runs)`` holds); returns them."""
        def finished() -> list[dict[str, Any]] | None:
            self.daemons.check()
            runs = self.runs(dag_id)
            if len(runs) >= at_least and all(r["state"] in TERMINAL for r in runs) and (done is None or done(runs)):
                return runs
            return None
        return wait_for(f"{dag_id}: {at_least} finished runs", finished, timeout=timeout, every=3)

    def task_instances(self, dag_id: str) -> list[dict[str, Any]]:
        """Every task instance of every run of ``dag_id`` (REST: hostname, state, try number, ...)."""
        out: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", f"/dags/{dag_id}/dagRuns/~/taskInstances?limit=100&offset={len(out)}")
            out.extend(page["task_instances"])
            if len(out) >= page["total_entries"] or not page["task_instances"]:
                return out

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The text of a task's logs in a run: every try's and its triggers' (written by the Celery
        workers and the triggerer under the shared AIRFLOW_HOME/logs)."""
        folder = Path(self.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "".join(f.read_text(errors="replace") for f in sorted((folder / f"task_id={task_id}").glob("*.log")))

    # --- Spark's own records ------------------------------------------------------------------

    def spark_workers(self) -> list[dict[str, Any]]:
        """Each Spark worker's JSON (``id``, ``executors``, ``finishedexecutors`` with ``appid``)."""
        return [get_json(f"{u}/json/") for u in self.spark_worker_uis]

    def spark_apps(self) -> dict[str, dict[str, Any]]:
        """Finished applications' event logs: app id -> ``{"properties": ..., "executor_hosts": [...]}``."""
        apps = {}
        for f in sorted(self.spark_events.iterdir()):
            if f.name.endswith(".inprogress"):
                continue
            app: dict[str, Any] = {"properties": {}, "executor_hosts": [], "id": None}
            for line in f.read_text().splitlines():
                ev = json.loads(line)
                kind = ev.get("Event")
                if kind == "SparkListenerApplicationStart":
                    app["id"] = ev["App ID"]
                elif kind == "SparkListenerEnvironmentUpdate":
                    props = ev["Spark Properties"]
                    app["properties"] = dict(props) if isinstance(props, list) else props
                elif kind == "SparkListenerExecutorAdded":
                    app["executor_hosts"].append(ev["Executor Info"]["Host"])
            apps[str(app["id"])] = app
        return apps


# --- start-up ---------------------------------------------------------------------------------


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    assert initdb, "PostgreSQL's initdb was not found: `make services` installs it (apt-get install postgresql)"
    return Path(initdb).parent


@contextmanager
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster on a free port; yields its SQLAlchemy URL (user ``airflow``, trust auth).

    SUBTLE: initdb refuses root, so as root the cluster lives in a folder of its own (not
    under pytest's root-only temporary folder) owned by the ``postgres`` user."""
    pg, port = _pg_bin(), free_port()
    data = Path(tempfile.mkdtemp(prefix="shardsink-pg-"))
    as_pg: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    def run(*argv: str) -> None:
        r = subprocess.run([*as_pg, *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{argv[0]}: {r.stdout[-2000:]}{r.stderr[-2000:]}"

    try:
        run(str(pg / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "airflow")
        opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
        run(str(pg / "pg_ctl"), "-D", str(data / "db"), "-o", opts, "-l", str(data / "log"), "-w", "start")
        yield f"airflow@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_pg, str(pg / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def _airflow_env(root: Path, pg: str, redis_port: int, master: str, api_port: int, slots: int) -> dict[str, str]:
    home = root / "airflow"
    (home / "dags").mkdir(parents=True)
    (root / "pythonpath").mkdir()
    (root / "pythonpath" / "topology_host.py").write_text(HOSTNAME_MODULE)
    (home / "passwords.json").write_text(json.dumps({ADMIN[0]: ADMIN[1]}))
    env = base_env(home)
    env.update({
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{pg}",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql://{pg}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(slots),
        "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "shardsink.airflow.celery_config.CELERY_CONFIG",  # the preload
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "topology_host.hostname",
        "PYTHONPATH": os.pathsep.join(p for p in (str(root / "pythonpath"), os.environ.get("PYTHONPATH")) if p),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": master.rsplit(":", 1)[0],
                                                  "port": int(master.rsplit(":", 1)[1])}),
        "SPARK_SUBMIT_OPTS": f"{env['SPARK_SUBMIT_OPTS']} {spark_defaults(root)}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "shardsink-topology-jwt-secret-not-for-production",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN[0]}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        # Quick to notice new DAG files and to schedule; one parsing process (2 cores).
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        # A DAG file is parsed when it appears (the refresh above); the tests never edit one, so
        # no periodic re-parse (default 30 s: the shardsink DAG files' imports, every 30 s, idle).
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    })
    return env


@contextmanager
def topology_stack(root: Path, *, slots: int = 2, queue_to_slots: bool = False) -> Iterator[Topology]:
    """Start the topology under ``root`` (the moto server's AWS settings must be in ``os.environ``).
    ``slots``: task slots of each Celery worker and cores of each Spark worker (the tests' 2;
    bench/backfill.py gives a parallel backfill more, as a larger cluster would).
    ``queue_to_slots``: the scheduler's ``parallelism`` is the workers' slots, so that tasks wait
    in Airflow's priority order rather than in the broker's arrival order (docs/deployment.md,
    "Task order in a backfill"); otherwise Airflow's default (32)."""
    if not 1 <= slots <= 16:
        raise ValueError(f"slots={slots!r}: expected 1..16")
    logs = root / "logs"
    logs.mkdir(parents=True)
    with ExitStack() as stack:
        daemons = Daemons(logs)
        stack.callback(daemons.stop)
        redis_port, api_port = free_port(), free_port()
        daemons.start("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--daemonize", "no"], dict(os.environ))
        def bound(name: str) -> tuple[str, str]:
            def logged() -> tuple[str, str] | None:
                daemons.check()
                return bound_master(daemons.logs / f"{name}.log")
            return wait_for(f"{name} bound", logged, timeout=120, every=0.5, log=daemons.logs / f"{name}.log")
        master, master_ui = start_spark(daemons.start, bound, root, base_env(root), cores=slots)
        pg = stack.enter_context(postgres())
        stack.callback(daemons.stop)  # again (idempotent): Airflow's processes stop before PostgreSQL does
        env = _airflow_env(root, pg, redis_port, master, api_port, slots)
        if queue_to_slots:
            env["AIRFLOW__CORE__PARALLELISM"] = str(slots * len(WORKERS))
        migrate = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True,
                                 text=True, timeout=600)
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        af = str(VENV_BIN / "airflow")
        daemons.start("api-server", [af, "api-server", "--port", str(api_port), "--workers", "1"], env)
        daemons.start("scheduler", [af, "scheduler", "--skip-serve-logs"], env)
        daemons.start("dag-processor", [af, "dag-processor"], env)
        daemons.start("triggerer", [af, "triggerer"], env)
        for i, host in enumerate(WORKERS, 1):
            worker_env = {**env, "TOPOLOGY_HOSTNAME": host,
                          "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
            daemons.start(f"celery-worker-{i}", [af, "celery", "worker", "--celery-hostname", f"worker{i}@{host}",
                                                 "--concurrency", str(slots), "--without-mingle", "--without-gossip"],
                          worker_env)

        def alive_worker_uis() -> tuple[str, ...] | None:
            daemons.check()
            alive = [w["webuiaddress"] for w in get_json(f"{master_ui}/json/")["workers"] if w["state"] == "ALIVE"]
            return tuple(sorted(alive)) if len(alive) == 2 else None
        worker_uis = wait_for("two Spark workers registered", alive_worker_uis, timeout=180,
                              log=logs / "spark-master.log")
        topo = Topology(root=root, env=env, api_url=f"http://127.0.0.1:{api_port}", spark_master_ui=master_ui,
                        spark_worker_uis=worker_uis, spark_events=root / "spark-events", daemons=daemons)

        def api_up() -> bool:
            daemons.check()
            get_json(f"{topo.api_url}/api/v2/monitor/health", timeout=5)
            return True
        wait_for("api-server healthy", api_up, timeout=240, log=logs / "api-server.log")
        yield topo
