"""A PySpark worker daemon that imports what shardsink's executor code needs once, before it forks.

Set on a Spark Connect server: ``--conf spark.python.daemon.module=shardsink.spark.daemon``, and
on local-mode spark-submit applications of the write tasks (:func:`daemon_conf`).
A Connect server starts one Python worker daemon per client session (each session's jobs run
with their own ``SPARK_JOB_ARTIFACT_UUID``, so sessions never share a daemon), and every worker
the daemon forks for a session's tasks would import pyarrow, the worker's own modules and
shardsink afresh. This daemon has them imported before it forks its workers, shared
copy-on-write; and it is itself forked from the JVM's fork server (:mod:`shardsink.spark.forkserver`),
which imports them once for all of the JVM's daemons (measured: bench/daemon_cost.py). Changes
nothing a worker computes.

Spark puts its own ``python/lib/pyspark.zip`` first on the workers' ``PYTHONPATH``. Python never
caches bytecode for a module imported from a zip, so every daemon (one per session) compiled
pyspark from source: measured 2.2-2.9 CPU-s for the first Python task of a session, against
0.9 with pyspark's installed copy. When the Python running the daemon has pyspark installed in
exactly the zip's version (the pip ``pyspark`` the server was started from does), the daemon
drops the zip from its path and imports that copy, bytecode cached; otherwise it keeps the zip.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import zipfile
from collections.abc import Mapping

#: The value of ``spark.python.daemon.module`` that runs this module.
DAEMON_MODULE = "shardsink.spark.daemon"
_DAEMON_CONF = "spark.python.daemon.module"
_VERSION = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""")


def _version(text: str) -> str | None:
    got = _VERSION.search(text)
    return got.group(1) if got else None


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` without its ``pyspark.zip`` entries if the rest of it finds a pyspark package of
    the zip's own version (module docstring); else ``path`` unchanged."""
    zips = [p for p in path if os.path.basename(p) == "pyspark.zip"]
    if not zips:
        return path
    rest = [p for p in path if p not in zips]
    try:
        spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
        if spec is None or not spec.submodule_search_locations:
            return path
        with open(os.path.join(next(iter(spec.submodule_search_locations)), "version.py")) as f:
            installed = _version(f.read())
        with zipfile.ZipFile(zips[0]) as z:
            zipped = _version(z.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return path
    return rest if installed is not None and installed == zipped else path


def daemon_conf(conf: Mapping[str, str], *, master: str, worker_python: str | None,
                this_python: str = sys.executable) -> dict[str, str]:
    """``conf`` plus ``spark.python.daemon.module`` = this module when the application's Python
    workers surely import this very shardsink: the master is ``local[...]`` (the workers are
    children of the driver, on this machine) and they run ``this_python`` (``worker_python``,
    the application's ``PYSPARK_PYTHON``), which imports the shardsink the job ships.

    Hazard: on a cluster the executors' Python may lack shardsink, and a daemon module it cannot
    import fails every Python task; ``conf`` is then returned unchanged, as it is when it names a
    daemon module of its own. Effect (bench/write_cost.py ``--submit-baseline``): a one-slot job
    ends about 1 s sooner, the preload running while the JVM plans; its CPU is the same, the
    preload costing what its one worker's own imports did."""
    out = dict(conf)
    if master.startswith("local") and worker_python == this_python and _DAEMON_CONF not in out:
        out[_DAEMON_CONF] = DAEMON_MODULE
    return out


if __name__ == "__main__":
    sys.path[:] = prefer_installed_pyspark(sys.path)  # before anything imports pyspark
    from shardsink.spark.forkserver import launch, preload

    code = launch()  # this JVM's fork server runs the daemon, its imports made once (forkserver.py)
    if code is not None:
        sys.exit(code)
    from pyspark.daemon import manager

    preload()
    manager()
