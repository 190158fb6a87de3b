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


def start_spark(start: Start, root: Path, env: dict[str, str], *, cores: int = 2
                ) -> tuple[str, str, tuple[str, ...]]:
    """The master and two workers of ``cores`` cores each (512 MiB of executor memory per core),
    started by ``start``; returns (master URL, master UI, worker UIs)."""
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
                                            "--webui-port", str(wui), "--cores", str(cores),
                                            "--memory", f"{512 * cores}m",
                                            "--work-dir", str(work), master], spark_env)
        worker_uis.append(f"http://127.0.0.1:{wui}")
    return master, f"http://127.0.0.1:{ui}", tuple(worker_uis)
