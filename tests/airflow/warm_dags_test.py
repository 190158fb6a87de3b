"""``airflow dags test`` through warm processes (:mod:`shardsink_dev.dagrunner`).

One runner per set of start-level variables (:func:`start_level`: Airflow's home,
metadata DB, folders and connections; ``PYTHONPATH`` and its fault injection), started at
its first run and stopped after each test by the conftest. A run's result is a
``CompletedProcess`` like the CLI's: the exit code, and the run's whole output (Airflow's,
the tasks', spark-submit's) as ``stdout``.

SUBTLE: a test that kills a run mid-flight, or that needs the run in the background,
starts a real CLI process instead (``Env.popen_dags_test``): a killed runner would take the
next run's warm process with it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from shardsink_dev.dagrunner import start_level

REPO = Path(__file__).resolve().parents[2]
#: Starts the runner from the repository without putting anything on the tasks' PYTHONPATH.
_START = (f"import sys; sys.path[0] = {str(REPO)!r}; from shardsink_dev.dagrunner import main; "
          "del sys.path[0]; main()")
_RUNNERS: dict[tuple[tuple[str, str], ...], _Runner] = {}
_SEQ = itertools.count()


class _Runner:
    def __init__(self, env: dict[str, str]) -> None:
        self.home = Path(env["AIRFLOW_HOME"])
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "dagrunner.err", "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _START], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         start_new_session=True)

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        log = self.home / f"dags-test-{next(_SEQ)}.log"
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        out = log.read_text(errors="replace") if log.exists() else ""
        if not ready:
            self.kill()
            raise subprocess.TimeoutExpired(["airflow", *argv], timeout, output=out)
        if not line:
            self.kill()
            err = (self.home / "dagrunner.err").read_text(errors="replace")
            raise RuntimeError(f"the dags test runner died: {out[-3000:]}{err[-3000:]}")
        rc = json.loads(line)["rc"]
        return subprocess.CompletedProcess(["airflow", *argv], rc, stdout=out, stderr="")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            pass
        self.kill()  # and whatever a run left in its process group


def dags_test(env: dict[str, str], dag_id: str, logical_date: str, *, conf: dict[str, object] | None = None,
              timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """``airflow dags test DAG_ID LOGICAL_DATE [-c CONF]`` under ``env``, on a warm runner."""
    argv = ["dags", "test", dag_id, logical_date] + ([] if conf is None else ["-c", json.dumps(conf)])
    key = tuple(sorted(start_level(env).items()))
    runner = _RUNNERS.get(key)
    if runner is None or runner.proc.poll() is not None:
        runner = _RUNNERS[key] = _Runner(env)
    try:
        return runner.run(argv, env, timeout)
    except BaseException:
        _RUNNERS.pop(key, None)
        runner.kill()
        raise


def close_all() -> None:
    """Stops every runner (after each test: a runner holds its test's Airflow home)."""
    while _RUNNERS:
        _RUNNERS.popitem()[1].close()
