"""The suite's Spark JVM flags (shardsink_dev/jvm.py): the class-data archives are really mapped by
spark-submit's launcher and driver on Spark's real classpath (``-Xshare:on`` refuses to start
otherwise), and a classpath without an archive gets the plain flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shardsink_dev import jvm

JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
print("ROWS", spark.range(3).count())
spark.stop()
"""


def test_spark_submit_starts_on_both_archives_with_sharing_required(tmp_path: Path) -> None:
    driver, launcher = jvm.build_archives()  # already built by `make test`: then a no-op
    assert driver.exists() and launcher.exists()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           # -Xshare:on: a JVM that cannot map its archive exits instead of starting without it
           "SPARK_SUBMIT_OPTS": jvm.submit_opts().replace("-Xshare:auto", "-Xshare:on"),
           "SPARK_LAUNCHER_OPTS": jvm.launcher_opts().replace("-Xshare:auto", "-Xshare:on")}
    assert str(driver) in env["SPARK_SUBMIT_OPTS"] and str(launcher) in env["SPARK_LAUNCHER_OPTS"]
    r = subprocess.run([str(Path(sys.executable).with_name("spark-submit")), "--master", "local[1]", "--conf",
                        "spark.ui.enabled=false", str(job)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "ROWS 3" in r.stdout


def test_another_conf_dir_has_its_own_archive_and_none_means_the_plain_flags(tmp_path: Path) -> None:
    assert jvm.archive_path("driver", tmp_path) != jvm.archive_path("driver")
    assert jvm.archive_path("launcher") == jvm.archive_path("launcher")  # the launcher's classpath is the jars alone
    assert not jvm.archive_path("driver", tmp_path).exists()
    assert jvm.submit_opts(tmp_path) == jvm.BASE_OPTS
