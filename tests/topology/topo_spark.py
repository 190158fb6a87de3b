"""The Spark standalone part of the production topology (topo_stack.py): the Celery workers'
spark-submit defaults, and the master with two workers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from shardsink_dev import jvm
from shardsink_dev.testing import free_port
from tests.airflow.af_helpers import JVM_OPTS, VENV_BIN

#: Starts a named daemon (``topo_stack.Daemons.start``).
Start = Callable[[str, list[str], dict[str, str]], object]
#: Waits until the named daemon's log says what it bound, and returns it (:func:`bound_master`).
Bound = Callable[[str], tuple[str, str]]

_MASTER_AT = re.compile(r"Starting Spark master at (spark://[\d.]+:\d+)")
_MASTER_UI_AT = re.compile(r"Bound MasterWebUI to [\d.]+, and started at http://[^:/]+:(\d+)")


def bound_master(log: Path) -> tuple[str, str] | None:
    """(master URL, master UI) as the master logged them once bound, or None before then.

    SUBTLE: the ports asked for are only hints: a port ``free_port`` saw free can be taken by
    another process before the master binds it, and the master then binds the next one."""
    text = log.read_text(errors="replace") if log.exists() else ""
    url, ui = _MASTER_AT.search(text), _MASTER_UI_AT.search(text)
    return (url.group(1), f"http://127.0.0.1:{ui.group(1)}") if url and ui else None

def spark_defaults(root: Path) -> str:
    """The Celery workers' spark-submit defaults, as ``-Dspark.*`` options for ``SPARK_SUBMIT_OPTS``.

    SUBTLE: not a ``SPARK_CONF_DIR`` with a spark-defaults.conf: that folder heads the driver's
    classpath, and a JVM maps a class-data archive only when each folder on its classpath is
    as empty as when the archive was dumped (shardsink_dev/jvm.py); the default conf folder is."""
    events = root / "spark-events"
    events.mkdir()
    props = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "1",
             "spark.driver.memory": "512m", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
             "spark.sql.session.timeZone": "UTC", "spark.eventLog.enabled": "true",
             "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false",
             "spark.eventLog.rolling.enabled": "false",
             # the executors' classpath is the default one: the suite's archive (jvm.submit_opts)
             "spark.executor.extraJavaOptions": f'"{jvm.submit_opts()}"'}
    return " ".join(f"-D{k}={v}" for k, v in props.items())


def start_spark(start: Start, bound: Bound, root: Path, env: dict[str, str], *, cores: int = 2
                ) -> tuple[str, str]:
    """The master and two workers of ``cores`` cores each (512 MiB of executor memory per core),
    started by ``start``; returns (master URL, master UI). The workers start once the master has
    logged the ports it bound (``bound_master``); their UIs are in the master's JSON
    (``webuiaddress``), as they bound them."""
    port, ui = free_port(), free_port()
    spark_env = {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
                 "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(root / "logs")}
    cls = str(VENV_BIN / "spark-class")
    start("spark-master", [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                           "--port", str(port), "--webui-port", str(ui)], spark_env)
    master, master_ui = bound("spark-master")
    for i in (1, 2):
        wui = free_port()
        work = root / f"spark-worker-{i}"
        work.mkdir()
        # Executors are the worker's children: they inherit its environment (the S3 endpoint).
        start(f"spark-worker-{i}", [cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--webui-port", str(wui), "--cores", str(cores),
                                            "--memory", f"{512 * cores}m",
                                            "--work-dir", str(work), master], spark_env)
    return master, master_ui
