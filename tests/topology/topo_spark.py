"""The Spark standalone part of the production topology (topo_stack.py): the Celery workers'
spark-submit defaults, and the master with two workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shardsink_dev import jvm
from shardsink_dev.testing import free_port
from tests.airflow.af_helpers import JVM_OPTS, VENV_BIN

#: Starts a named daemon (``topo_stack.Daemons.start``).
Start = Callable[[str, list[str], dict[str, str]], object]

def spark_conf(root: Path) -> Path:
    """SPARK_CONF_DIR of the Celery workers' spark-submits: the cluster's defaults (module docstring)."""
    conf, events = root / "spark-conf", root / "spark-events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text("\n".join([
        "spark.executor.memory 512m", "spark.executor.cores 1", "spark.cores.max 1", "spark.driver.memory 512m",
        "spark.ui.enabled false", "spark.ui.showConsoleProgress false", "spark.sql.session.timeZone UTC",
        f"spark.executor.extraJavaOptions {jvm.submit_opts()}", "spark.eventLog.enabled true",  # default classpath
        f"spark.eventLog.dir {events.as_uri()}", "spark.eventLog.compress false",
        "spark.eventLog.rolling.enabled false", "",
    ]))
    return conf


def start_spark(start: Start, root: Path, env: dict[str, str]) -> tuple[str, str, tuple[str, ...]]:
    """The master and two workers, started by ``start``; returns (master URL, master UI, worker UIs)."""
    port, ui = free_port(), free_port()
    spark_env = {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS,
                 "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(root / "logs")}
    cls = str(VENV_BIN / "spark-class")
    start("spark-master", [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                           "--port", str(port), "--webui-port", str(ui)], spark_env)
    master = f"spark://127.0.0.1:{port}"
    worker_uis = []
    for i in (1, 2):
        wui = free_port()
        work = root / f"spark-worker-{i}"
        work.mkdir()
        # Executors are the worker's children: they inherit its environment (the S3 endpoint).
        start(f"spark-worker-{i}", [cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--webui-port", str(wui), "--cores", "2", "--memory", "1g",
                                            "--work-dir", str(work), master], spark_env)
        worker_uis.append(f"http://127.0.0.1:{wui}")
    return master, f"http://127.0.0.1:{ui}", tuple(worker_uis)
