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

import atexit
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
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


def _serve(parser: Any, started_with: dict[str, str], reply: TextIO, requests: TextIO) -> None:
    for line in requests:
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
    """One runner: forked from the zygote of its ``PYTHON*`` variables when there is one, else
    started as its own interpreter; ``pid`` leads its process group."""

    def __init__(self, env: dict[str, str]) -> None:
        self.home = Path(env["AIRFLOW_HOME"])
        self.home.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[str] | None = None
        self.sock: socket.socket | None = None
        self.pidfd = -1
        zygote = _zygote(env)
        if zygote is None:
            with open(self.home / "dagrunner.err", "ab") as err:
                self.proc = subprocess.Popen([sys.executable, "-c", _START], env=env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.pid, self.requests, self.replies = self.proc.pid, self.proc.stdin, self.proc.stdout
            return
        folder = tempfile.mkdtemp(prefix="dagrunner-")  # short: a socket's path has at most 107 bytes
        path = os.path.join(folder, "s")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(path)
                listener.listen(1)
                assert zygote.stdin is not None and zygote.stdout is not None
                zygote.stdin.write(json.dumps({"env": env, "socket": path,
                                               "err": str(self.home / "dagrunner.err")}) + "\n")
                zygote.stdin.flush()
                self.pid = json.loads(zygote.stdout.readline())["pid"]
                self.pidfd = os.pidfd_open(self.pid)
                # The runner connects, or ends (its pidfd turns readable) without connecting.
                ready = select.select([listener.fileno(), self.pidfd], [], [], 300)[0]
                if listener.fileno() not in ready:
                    self.kill()
                    died = ""
                    with contextlib.suppress(OSError):
                        died = (self.home / "dagrunner.err").read_text(errors="replace")[-3000:]
                    what = "ended before it connected" if ready else "did not connect in 300 s"
                    raise RuntimeError(f"the dags test runner {what}: {died}")
                conn, _ = listener.accept()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.rmdir(folder)
        self.requests, self.replies = conn.makefile("w"), conn.makefile("r")
        self.sock = conn

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return not select.select([self.pidfd], [], [], 0)[0]  # a pidfd is readable once its process ended

    def run(self, argv: list[str], env: dict[str, str], timeout: float, *, parse_only: bool = False,
            split: bool = False) -> subprocess.CompletedProcess[str]:
        n = next(_SEQ)
        log = self.home / f"dags-test-{n}.log"
        err = self.home / f"dags-test-{n}.err" if split else None
        self.requests.write(json.dumps({"argv": argv, "env": env, "log": str(log), "parse_only": parse_only,
                                        "err": str(err) if err else None}) + "\n")
        self.requests.flush()
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
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

    def _wait(self, timeout: float) -> bool:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        return bool(select.select([self.pidfd], [], [], timeout)[0])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self._wait(30)
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.sock is not None:
            self.replies.close()
            self.sock.close()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.requests.close()
            if self.sock is not None:
                self.sock.shutdown(socket.SHUT_WR)  # the runner's end of input (its replies' file shares the socket)
        self._wait(30)
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
    if runner is None or not runner.alive():
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

    _serve(cli_parser.get_parser(), start_level(dict(os.environ)), reply, sys.stdin)


# -- the zygote: runners forked warm -------------------------------------------------------
#
# Most of a runner's start-up is importing third-party packages that read no Airflow setting.
# One zygote per pytest process imports them once (:data:`PRELOAD`); each runner is then
# forked from it and imports Airflow under its own environment (Airflow reads its
# configuration when imported). It talks to its client over a Unix socket instead of pipes.
#
# SUBTLE: a preloaded module must read nothing from the environment at import that a run may
# set: Airflow, its providers and shardsink stay out. The interpreter reads ``PYTHON*``
# (``PYTHONPATH``'s ``sitecustomize``: fault injection) only at start, so a request with other
# such variables than the zygote's, or with fault injection, starts a runner as before.

#: What the zygote imports before it forks (the bulk of a runner's import time besides Airflow's own).
PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "pyarrow.compute", "sqlalchemy", "sqlalchemy.orm",
           "libcst", "cadwyn", "aiohttp", "fastapi", "starlette.applications", "pydantic", "pydantic_settings", "trio",
           "rich.console", "cryptography.fernet", "jinja2", "httpx", "werkzeug", "email_validator", "fsspec", "upath",
           "structlog", "psutil", "pendulum", "msgspec", "tenacity", "opentelemetry.trace", "botocore.session",
           "boto3", "pyspark.sql")
_ZYGOTE_START = (f"import sys; sys.path[0] = {str(REPO)!r}; from shardsink_dev.dagrunner import zygote_main; "
                 "del sys.path[0]; zygote_main()")
_ZYGOTES: dict[tuple[tuple[str, str], ...], subprocess.Popen[str]] = {}


def _zygote_key(env: dict[str, str]) -> tuple[tuple[str, str], ...] | None:
    """The zygote a runner for ``env`` may be forked from (its ``PYTHON*`` variables), or None."""
    level = start_level(env)
    if "PYTHONPATH" in level or "SHARDSINK_TEST_FAULTS" in level:
        return None
    return tuple(sorted((k, v) for k, v in level.items() if not k.startswith("AIRFLOW")))


def _zygote(env: dict[str, str]) -> subprocess.Popen[str] | None:
    key = _zygote_key(env)
    if key is None:
        return None
    z = _ZYGOTES.get(key)
    if z is None or z.poll() is not None:
        base = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW", "SHARDSINK"))}
        z = _ZYGOTES[key] = subprocess.Popen([sys.executable, "-c", _ZYGOTE_START], env=base, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                             start_new_session=True)
    return z


def stop_zygotes() -> None:
    """Ends every zygote (its runners live on until their own clients close them)."""
    while _ZYGOTES:
        z = _ZYGOTES.popitem()[1]
        with contextlib.suppress(BrokenPipeError, OSError):
            assert z.stdin is not None
            z.stdin.close()
        try:
            z.wait(timeout=10)
        except subprocess.TimeoutExpired:
            z.kill()
            z.wait()


atexit.register(stop_zygotes)


def _forked_runner(req: dict[str, Any]) -> None:
    """In the child: become a runner for ``req["env"]``, serving the client at ``req["socket"]``."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its tasks wait for their own children
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)
    os.close(null)
    os.close(err)
    os.environ.clear()
    os.environ.update(req["env"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(req["socket"])
    from airflow.cli import cli_parser

    _serve(cli_parser.get_parser(), start_level(dict(os.environ)), sock.makefile("w"), sock.makefile("r"))


def _reap(*_: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def zygote_main() -> None:
    """Import :data:`PRELOAD`, then fork a runner per request line (``{"env", "socket", "err"}``),
    answering each with ``{"pid": ...}``; end of input ends the zygote."""
    import importlib

    reply = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    # The zygote reaps its runners itself (not SIG_IGN, whose reaping drops their CPU times): so
    # their CPU reaches the zygote's, and at its end the pytest process's, children's times.
    signal.signal(signal.SIGCHLD, _reap)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            # SUBTLE: the runner ends as an interpreter does (SystemExit, up through this loop):
            # Airflow's exit handlers close the metadata DB, whose SQLite write-ahead log a bare
            # os._exit would leave beside it, unmerged.
            reply.close()  # the zygote's: its client must see it end with the zygote
            try:
                _forked_runner(req)
            except Exception:
                traceback.print_exc()
                raise SystemExit(1) from None
            raise SystemExit(0)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
