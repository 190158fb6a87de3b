"""JVM flags of the test suite's short-lived Spark JVMs, and their class-data-sharing archives.

Every spark-submit starts two JVMs (the launcher, then the driver), PySpark's shared
sessions start a driver, and a standalone cluster starts executors. Most of a short JVM's CPU
is spent before it computes anything: JIT compilation, a parallel GC sized for a big heap, and
loading and verifying Spark's ~10,000 classes. Two remedies, neither of which changes what a
JVM computes, only how fast it starts:

* :data:`BASE_OPTS`: the client (C1) compiler and the serial GC;
* an AppCDS *dynamic archive* per classpath (`JEP 350`_): the classes a representative Spark
  job loaded, parsed and verified once, then mapped read-only (and shared in memory) by every
  later JVM. A trivial ``spark-submit`` measured 8.5 s CPU without, 4.5 s with it (2 cores).

The archive is tied to the exact ``java`` binary, the Spark jars and the classpath, whose
first entry is ``SPARK_CONF_DIR``: :func:`archive_path` keys it by all three, and a JVM that
finds it stale or missing starts as before (``-Xshare:auto``; the ``cds`` log tags are off so
no warning reaches a job's stdout). ``python -m shardsink_dev.jvm`` builds the default
classpath's archives (``make test`` does, before the suite).

SUBTLE: a JVM maps an archive only if every folder on its classpath is as empty as when the
archive was dumped, and a ``SPARK_CONF_DIR`` holding a spark-defaults.conf is not: give such
JVMs their settings another way (``--conf``, ``-Dspark.*`` in ``SPARK_SUBMIT_OPTS``), as the
production-topology fixture does (tests/topology/topo_spark.py).

.. _JEP 350: https://openjdk.org/jeps/350
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

#: C1 compiler, serial GC: about a third less CPU per test JVM on 2 cores.
BASE_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
_QUIET = "-Xshare:auto -Xlog:cds*=off"
Kind = Literal["driver", "launcher"]

#: The job whose loaded classes the driver archive holds: what the suite's jobs do (Arrow in
#: and out, Parquet written and read, SQL aggregation, a Python UDF over Arrow batches).
_DUMP_JOB = '''
import sys
import pyarrow as pa
from pyspark.sql import SparkSession
out = sys.argv[1]
spark = SparkSession.builder.appName("shardsink-cds").getOrCreate()
df = spark.createDataFrame(pa.table({"k": ["a", "b", "a"], "x": [1.0, -0.0, float("nan")], "_time": [1, 2, 3]}))
df.mapInArrow(lambda batches: batches, df.schema).write.mode("overwrite").parquet(out)
back = spark.read.parquet(out)
back.createOrReplaceTempView("t")
spark.sql("SELECT k, sum(_time) AS s, count(*) AS n FROM t GROUP BY k HAVING sum(_time) <> 0").toArrow()
back.orderBy("k", "_time").toPandas()
spark.stop()
'''


def _spark_home() -> Path:
    import pyspark

    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)


def _java() -> Path:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")
    return found.resolve()


def archive_path(kind: Kind, conf_dir: Path | None = None) -> Path:
    """Where the ``kind`` archive for this Java, these Spark jars and ``conf_dir`` lives (it may not exist).

    The launcher's classpath is the jars alone, so its archive ignores ``conf_dir``."""
    java, jars = _java(), _spark_home() / "jars"
    parts = [str(java), str(java.stat().st_mtime_ns) if java.exists() else "", str(jars),
             str(jars.stat().st_mtime_ns) if jars.exists() else ""]
    if kind == "driver":
        parts.append(str((conf_dir or _spark_home() / "conf").resolve()))
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return Path(sys.prefix) / "spark-cds" / f"{kind}-{key}.jsa"


def _with_archive(kind: Kind, conf_dir: Path | None) -> str:
    path = archive_path(kind, conf_dir)
    return f"{BASE_OPTS} -XX:SharedArchiveFile={path} {_QUIET}" if path.exists() else BASE_OPTS


def submit_opts(conf_dir: Path | None = None) -> str:
    """``SPARK_SUBMIT_OPTS`` (and executors' ``extraJavaOptions``) for JVMs on ``conf_dir``'s classpath."""
    return _with_archive("driver", conf_dir)


def launcher_opts() -> str:
    """``SPARK_LAUNCHER_OPTS``: the launcher JVM every ``spark-submit`` starts first."""
    return _with_archive("launcher", None)


def build_archives(*, conf_dir: Path | None = None, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Build the driver and launcher archives for ``conf_dir`` unless they exist; returns their paths.

    One local ``spark-submit`` of :data:`_DUMP_JOB` writes both at exit (~15 s CPU). Written
    under temporary names and renamed: a JVM never maps half an archive, and a concurrent
    build only wastes its own run. A failed build leaves no archive (the JVMs start as before)."""
    driver, launcher = archive_path("driver", conf_dir), archive_path("launcher")
    if driver.exists() and launcher.exists():
        return driver, launcher
    driver.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=driver.parent) as tmp:
        job = Path(tmp) / "cds_job.py"
        job.write_text(_DUMP_JOB)
        tmp_driver, tmp_launcher = Path(tmp) / "driver.jsa", Path(tmp) / "launcher.jsa"
        run_env = {**(env if env is not None else os.environ), "PYSPARK_PYTHON": sys.executable,
                   "SPARK_LOCAL_IP": "127.0.0.1",
                   "SPARK_SUBMIT_OPTS": f"{BASE_OPTS} -XX:ArchiveClassesAtExit={tmp_driver} -Xlog:cds*=off",
                   "SPARK_LAUNCHER_OPTS": f"{BASE_OPTS} -XX:ArchiveClassesAtExit={tmp_launcher} -Xlog:cds*=off"}
        if conf_dir is not None:
            run_env["SPARK_CONF_DIR"] = str(conf_dir)
        submit = Path(sys.executable).with_name("spark-submit")
        r = subprocess.run([str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                            "--conf", "spark.eventLog.enabled=false", str(job),
                            str(Path(tmp) / "out")], env=run_env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not tmp_driver.exists():
            raise RuntimeError(f"building the Spark class-data archives failed ({r.returncode}):\n{r.stderr[-3000:]}")
        tmp_driver.rename(driver)
        if tmp_launcher.exists() and not launcher.exists():
            tmp_launcher.rename(launcher)
    return driver, launcher


def main() -> int:
    driver, launcher = build_archives()
    print(f"Spark class-data archives: {driver} ({driver.stat().st_size >> 20} MiB), {launcher}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
