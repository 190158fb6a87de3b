"""shardsink.spark.daemon: the worker daemon imports pyspark's installed copy (bytecode cached)
instead of Spark's ``pyspark.zip`` only when both are the same version; it runs only where the
workers surely import shardsink; an application's driver drops the zip too."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from shardsink.spark.daemon import DAEMON_MODULE, daemon_conf, prefer_installed_pyspark


def _installed(root: Path, version: str) -> str:
    (root / "pyspark").mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    (root / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    return str(root)


def _zip(root: Path, version: str) -> str:
    path = root / "lib" / "pyspark.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pyspark/__init__.py", "")
        z.writestr("pyspark/version.py", f'__version__ = "{version}"\n')
    return str(path)


def test_the_zip_is_dropped_for_an_installed_pyspark_of_its_version(tmp_path: Path) -> None:
    zipped, site = _zip(tmp_path / "spark", "4.2.0"), _installed(tmp_path / "site", "4.2.0")
    assert prefer_installed_pyspark([zipped, "/elsewhere", site]) == ["/elsewhere", site]


def test_the_zip_stays_for_another_version_or_no_installed_pyspark(tmp_path: Path) -> None:
    zipped, site = _zip(tmp_path / "spark", "4.2.0"), _installed(tmp_path / "site", "4.1.1")
    assert prefer_installed_pyspark([zipped, site]) == [zipped, site]
    assert prefer_installed_pyspark([zipped, str(tmp_path / "empty")]) == [zipped, str(tmp_path / "empty")]
    assert prefer_installed_pyspark([site]) == [site]


def test_an_unreadable_zip_leaves_the_path_alone(tmp_path: Path) -> None:
    bad = tmp_path / "pyspark.zip"
    bad.write_text("not a zip")
    site = _installed(tmp_path / "site", "4.2.0")
    assert prefer_installed_pyspark([str(bad), site]) == [str(bad), site]


def test_only_a_local_application_on_this_interpreter_gets_the_daemon() -> None:
    here, key = "/venv/bin/python", "spark.python.daemon.module"
    assert daemon_conf({"a": "1"}, master="local[2]", worker_python=here, this_python=here) == {
        "a": "1", key: DAEMON_MODULE}
    # a cluster's executors, or another interpreter, may not import shardsink: unchanged
    for master, worker in (("spark://m:7077", here), ("yarn", here), ("local[2]", "/usr/bin/python3"),
                           ("local[2]", None)):
        assert daemon_conf({"a": "1"}, master=master, worker_python=worker, this_python=here) == {"a": "1"}
    assert daemon_conf({key: "mine"}, master="local[*]", worker_python=here, this_python=here) == {key: "mine"}


def test_an_application_driver_imports_the_installed_pyspark_not_sparks_zip() -> None:
    """spark-submit puts Spark's pyspark.zip first on the driver's path; run_request drops it before
    the job imports pyspark (shardsink.spark.entrypoint)."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    path = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*.zip")), str(Path(__file__).parents[2] / "plugins")]
    imports = "import pyspark; print(pyspark.__file__)"
    run = ("from shardsink.spark.entrypoint import run_request\n"
           "from shardsink.spark.request import IngestWriteRequest\n"
           "run_request(['--request', '{}'], IngestWriteRequest, lambda r: {}, tag='T', prog='p')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    found = [subprocess.run([sys.executable, "-c", code + imports], env=env, capture_output=True, text=True,
                            check=True).stdout.strip() for code in ("", run)]
    assert found[0].startswith(path[0]), found  # the zip comes first without run_request
    assert ".zip" not in found[1] and found[1] == pyspark.__file__, found
