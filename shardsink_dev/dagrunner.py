"""A warm ``airflow dags test``: the same CLI command, run again and again in one process.

Each ``airflow dags test`` process spends about 11.6 s of CPU before and around the run
itself (imports, the in-process execution API building its versioned routes, syncing the
DAG bag); a second run in the same process costs under a second of it. The Airflow tests
run several DAG runs each, so they send them to one of these processes instead of
starting a CLI per run (tests/airflow/af_helpers.py).

What stays the same as the CLI: the command is parsed by Airflow's own CLI parser and run
by its own ``dags test`` function, which parses the DAG file again each time (the DAG
file's module is re-executed, so a DAG built from environment variables sees the run's),
and the tasks run in this process, as they do under the CLI. Each request carries the
run's whole environment: ``os.environ`` is replaced by it for the run (tasks and their
spark-submit children see exactly it), and its stdout and stderr go to the request's log
file at the file-descriptor level, so children write there too.

SUBTLE: some variables only act when a process starts: Airflow reads its configuration
(``AIRFLOW_*``: home, metadata DB, folders) once, at import, and the interpreter reads
``PYTHON*`` (``PYTHONPATH``: a test's ``sitecustomize`` fault injection) at start. A request
whose such variables (:func:`start_level`) differ from the ones this process started
with is refused (exit code 90); the caller starts another runner for them.

Protocol: one JSON object per line on stdin, ``{"argv": [...], "env": {...}, "log": path}``
with argv the words after ``airflow`` (and ``"parse_only": true`` to only parse them with
Airflow's parser: exit code 2 and argparse's message for a bad command, 0 otherwise;
``"err": path`` to send stderr there instead of to ``log``); one
JSON line back on the original stdout, ``{"rc": exit_code}``. End of input ends the process.
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
import traceback
from pathlib import Path
from typing import Any, TextIO

REFUSED = 90
_START_LEVEL = ("AIRFLOW", "PYTHON", "SHARDSINK_TEST_FAULTS")


def start_level(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that only act when a process starts."""
    return {k: v for k, v in env.items() if k.startswith(_START_LEVEL)}


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # as the interpreter does for SystemExit("message")
    return 1


def _run(parser: Any, argv: list[str], *, parse_only: bool = False) -> int:
    try:
        args = parser.parse_args(argv)
        if not parse_only:
            args.func(args)
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _serve(parser: Any, started_with: dict[str, str], reply: TextIO) -> None:
    for line in sys.stdin:
        req = json.loads(line)
        env: dict[str, str] = req["env"]
        if start_level(env) != started_with:
            rc = REFUSED
        else:
            os.environ.clear()
            os.environ.update(env)
            sys.stdout.flush()
            sys.stderr.flush()
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            if req.get("err"):  # stderr apart (a command whose stdout is data, e.g. `-o json`)
                fd = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 2)
                os.close(fd)
            try:
                rc = _run(parser, req["argv"], parse_only=bool(req.get("parse_only")))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                os.close(null)
        reply.write(json.dumps({"rc": rc}) + "\n")
        reply.flush()


# -- the client: runners per set of start-level variables --------------------------------
#
# One runner per set of start-level variables (Airflow's home, metadata DB, folders and
# connections; ``PYTHONPATH`` and its fault injection), started at its first run; the
# Airflow tests' conftest stops them after each test (:func:`close_all`). A run's result is
# a ``CompletedProcess`` like the CLI's: the exit code, and the run's whole output
# (Airflow's, the tasks', spark-submit's) as ``stdout``.
#
# SUBTLE: a test that kills a run mid-flight, or that needs the run in the background,
# starts a real CLI process instead: a killed runner would take the next run's warm
# process with it.

REPO = Path(__file__).resolve().parents[1]
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

    def run(self, argv: list[str], env: dict[str, str], timeout: float, *, parse_only: bool = False,
            split: bool = False) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        n = next(_SEQ)
        log = self.home / f"dags-test-{n}.log"
        err = self.home / f"dags-test-{n}.err" if split else None
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "log": str(log), "parse_only": parse_only,
                                          "err": str(err) if err else None}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        out = log.read_text(errors="replace") if log.exists() else ""
        if not ready:
            self.kill()
            raise subprocess.TimeoutExpired(["airflow", *argv], timeout, output=out)
        if not line:
            self.kill()
            died = (self.home / "dagrunner.err").read_text(errors="replace")
            raise RuntimeError(f"the dags test runner died: {out[-3000:]}{died[-3000:]}")
        rc = json.loads(line)["rc"]
        stderr = err.read_text(errors="replace") if err is not None and err.exists() else ""
        return subprocess.CompletedProcess(["airflow", *argv], rc, stdout=out, stderr=stderr)

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
    return airflow(env, argv, timeout=timeout)


def airflow(env: dict[str, str], argv: list[str], *, timeout: float = 400, parse_only: bool = False,
            split: bool = False) -> subprocess.CompletedProcess[str]:
    """``airflow ARGV...`` under ``env``, on a warm runner (``parse_only``: only Airflow's parser
    runs; ``split``: stderr apart from stdout, else both are ``stdout``)."""
    key = tuple(sorted(start_level(env).items()))
    runner = _RUNNERS.get(key)
    if runner is None or runner.proc.poll() is not None:
        runner = _RUNNERS[key] = _Runner(env)
    try:
        return runner.run(argv, env, timeout, parse_only=parse_only, split=split)
    except BaseException:
        _RUNNERS.pop(key, None)
        runner.kill()
        raise


def close_all() -> None:
    """Stops every runner (after each test: a runner holds its test's Airflow home)."""
    while _RUNNERS:
        _RUNNERS.popitem()[1].close()


def main() -> None:
    reply = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # Airflow's import-time output must not reach the reply channel
    os.close(null)
    from airflow.cli import cli_parser

    _serve(cli_parser.get_parser(), start_level(dict(os.environ)), reply)


if __name__ == "__main__":
    main()
