"""One warm process per Spark JVM that forks the Python worker daemons its sessions ask for.

A Spark JVM starts a Python worker daemon (:mod:`shardsink.spark.daemon`) per worker module and
per set of worker environment variables: a Spark Connect server starts at least one per client
session (each session's jobs carry their own ``SPARK_JOB_ARTIFACT_UUID``), and each daemon
imported pyarrow, pandas, pyspark's worker and shardsink's executor modules afresh (about 1.5-2
CPU-s a daemon). With this fork server, the first daemon a JVM starts also starts a fork server,
which imports them once; every daemon of that JVM (the *launcher*, the process Spark started)
then hands its standard streams, environment, working directory, arguments and path to the fork
server, which forks a child that becomes the daemon (pyspark's ``manager``) with exactly those.
The launcher stays as the process Spark knows: it passes SIGTERM and SIGINT on to the daemon and
exits with the daemon's exit code, so Spark starts, stops and kills workers as before.

Contract:

* **the same daemon**: the child runs pyspark's own ``manager`` with the launcher's environment
  (``os.environ`` replaced whole), working directory, ``sys.argv`` and ``sys.path``, on the
  launcher's stdin, stdout and stderr (the JVM's pipes);
* **one fork server per JVM and set of start conditions**: its name is derived from the
  interpreter, the path (less the working directory, which differs per session), the user, the
  parent (the JVM) and the environment less the variables that differ between one session's
  daemons and another's (:data:`PER_DAEMON`); a daemon whose conditions differ gets a fork server
  of its own, and one whose working directory holds a module the server imports runs its own;
* **it ends with its JVM**: the fork server watches its parent's pidfd and exits when the JVM
  does (its daemons end on their own, when the JVM's end of their stdin closes). It stays in the
  JVM's process group (a signal to the group reaches it), but once the launcher that started it
  ends it is no longer the JVM's descendant: count its CPU by the JVM's process group, not by
  parent links (bench/proc_cpu.py ``tree_cpu`` does both);
* **no fork server, no change**: where none can run (not Linux, no pidfd, it failed to start or
  refused the request) or the workers' environment sets ``SHARDSINK_WORKER_FORKSERVER=off``,
  :func:`launch` returns None and the caller runs the daemon itself, as pyspark does.

SUBTLE: the fork server listens on an abstract Unix socket (Linux: no file, gone with its
process), which any local user could connect to or bind first: each end checks the other's uid
(``SO_PEERCRED``) before it sends or serves a thing, since a request carries the session's
environment (its worker secret, maybe credentials). A fork server killed while its daemons run
leaves them running to their JVM's end; their launchers then exit 1 at once.

Only the standard library is imported here: a launcher imports this module and nothing heavy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

#: Worker environment variables that differ between daemons of one JVM and its sessions, and do
#: not change what a process imports: left out of the fork server's name.
PER_DAEMON = frozenset({"SPARK_JOB_ARTIFACT_UUID", "PYTHON_WORKER_FACTORY_SECRET", "PYTHON_WORKER_FACTORY_SOCK_DIR",
                        "SPARK_REUSE_WORKER", "PYTHON_FAULTHANDLER_DIR", "SPARK_BUFFER_SIZE", "PYTHON_UDF_BATCH_SIZE"})
MODULE = "shardsink.spark.forkserver"
#: The workers' environment variable that turns the fork server off (``off``): each daemon then
#: imports its modules itself, as pyspark's does (on a cluster: ``spark.executorEnv.<SWITCH>``).
SWITCH = "SHARDSINK_WORKER_FORKSERVER"
#: What a daemon imports before it forks workers (:func:`preload`).
PRELOAD = ("pyarrow", "pyarrow.parquet", "pyarrow.compute", "pandas", "pyspark.worker",
           "pyspark.sql.pandas.serializers", "shardsink.spark.stage", "shardsink.spark.connect",
           "shardsink.sources.landing.read", "shardsink.outcome")
#: Top-level packages of :data:`PRELOAD` and what they import.
PRELOADED_TOP = ("shardsink", "pyspark", "pyarrow", "pandas", "numpy")
#: How long a launcher waits for a fork server it started to say it listens (it says so first).
START_TIMEOUT_S = 120.0
#: The largest request a fork server reads (a launcher's environment, path and argv).
MAX_REQUEST = 16 << 20
_CRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def preload() -> None:
    """Import the executors' modules (:data:`PRELOAD`); a module that fails to import is left to
    the worker, which then reports it as it would without a preload."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            continue


def server_name(*, executable: str, path: Sequence[str], env: Mapping[str, str], parent: int) -> bytes:
    """The abstract socket name of the fork server for these start conditions (module docstring)."""
    material = json.dumps([executable, list(path), sorted((k, v) for k, v in env.items() if k not in PER_DAEMON),
                           parent, os.getuid()])
    return b"\0shardsink-worker-forkserver-" + hashlib.sha256(material.encode()).hexdigest()[:32].encode()


def _same_user(sock: socket.socket) -> bool:
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return bool(uid == os.getuid())


def _connect(name: bytes) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
    except OSError:
        sock.close()
        return None
    if not _same_user(sock):
        sock.close()
        return None
    return sock


def _start_server(name: bytes, parent: int, env: Mapping[str, str]) -> bool:
    """Start a fork server for ``name``; True once one listens on it (this one or a rival's)."""
    import subprocess

    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, name[1:].decode(), str(parent), json.dumps(sys.path)],
                                env={k: v for k, v in env.items() if k not in PER_DAEMON}, stdin=subprocess.DEVNULL,
                                stdout=w, stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        os.close(r)
        return False
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as said:
        ready = select.select([said], [], [], START_TIMEOUT_S)[0]
        line = said.readline().strip() if ready else b""
    if not ready:
        proc.kill()
    return line in (b"ready", b"taken")


def launch(*, parent: int | None = None) -> int | None:
    """Run this process's daemon in a child of the JVM's fork server and return its exit code; None
    if no fork server could be asked (the caller then runs the daemon itself). A request sent
    and left unanswered returns 1: a daemon may be running on these pipes, so none may start."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return None
    if os.environ.get(SWITCH, "on") == "off":
        return None
    parent = os.getppid() if parent is None else parent
    env, here = dict(os.environ), os.path.realpath(os.getcwd())
    # ``-m`` put the working directory first on the path, and Spark runs each session's daemon in
    # that session's own folder: left out of the name, unless it holds a module the fork server
    # imports (then this daemon imports its own).
    path = [p for p in sys.path if os.path.realpath(p or ".") != here]
    if len(path) < len(sys.path) and any(os.path.exists(os.path.join(here, m)) or os.path.exists(
            os.path.join(here, m + ".py")) for m in PRELOADED_TOP):
        return None
    name = server_name(executable=sys.executable, path=path, env=env, parent=parent)
    sock = _connect(name)
    if sock is None and _start_server(name, parent, env):
        sock = _connect(name)
    if sock is None:
        return None
    # SUBTLE: Spark may stop this daemon (SIGTERM) before the fork server says which process runs
    # it: the signal is held until then, and passed on, so the daemon never outlives its stop.
    target: list[int] = []
    held: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if not target:
            held.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(target[0], signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as pyspark's daemon does (its workers' shutdown signal)
    with sock:
        body = json.dumps({"env": env, "cwd": os.getcwd(), "argv": sys.argv, "path": sys.path}).encode()
        try:
            socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2])
            sock.sendall(body)
        except OSError:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            return 1 if held else None  # nothing was asked of the server: the caller may run the daemon
        try:
            first = json.loads((replies := sock.makefile("rb")).readline() or b"{}")
        except (OSError, ValueError):
            first = {}
        if not isinstance(first.get("pid"), int):
            return 1  # asked, and no answer: a daemon may run; never start a second one on these pipes
        target.append(first["pid"])
        for signum in held:
            forward(signum, None)
        try:
            last = json.loads(replies.readline() or b"{}")
        except (OSError, ValueError):
            last = {}
        code = last.get("exit")
        return code if isinstance(code, int) else 1


def _child(conn: socket.socket, fds: list[int], req: Mapping[str, Any], closing: Sequence[int]) -> None:
    """In the forked child: become the requesting launcher's daemon; never returns."""
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()
        for std, fd in enumerate(fds):  # received as fds >= 3: the server's 0-2 are open (devnull)
            os.dup2(fd, std)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv[:] = req["argv"]
        sys.path[:] = req["path"]
        sys.stdin, sys.stdout, sys.stderr = (os.fdopen(0, "r", closefd=False), os.fdopen(1, "w", closefd=False),
                                             os.fdopen(2, "w", closefd=False))
        from pyspark.daemon import manager

        manager()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _accept(listener: socket.socket, closing: Sequence[int], clients: dict[int, socket.socket]) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        if not _same_user(conn):
            raise OSError("another user's request")
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if len(head) != 4 or len(fds) != 3:
            raise ValueError(f"a request of {len(head)} header bytes and {len(fds)} streams")
        (size,) = struct.unpack("!I", head)
        if size > MAX_REQUEST:
            raise ValueError(f"a request of {size} bytes (at most {MAX_REQUEST})")
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("the launcher hung up")
            body += chunk
        req = json.loads(body)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return  # refused: no pid sent, nothing forked
    pid = os.fork()
    if pid == 0:
        _child(conn, fds, req, [*closing, *(c.fileno() for c in clients.values())])
    for fd in fds:
        os.close(fd)
    clients[pid] = conn
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _reap(clients: dict[int, socket.socket]) -> None:
    while clients:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


def serve(name: bytes, parent: int, path: list[str]) -> None:
    """The fork server: listen on ``name`` (telling the starter ``ready`` on stdout, or ``taken`` if
    another already does, before any import: a rival costs nothing), import the daemon's modules
    on the launchers' ``path``, fork a daemon per request, and end when ``parent`` does."""
    try:
        watch = os.pidfd_open(parent)
    except OSError:
        return  # the JVM already ended (or no pidfd): say nothing; the launcher runs its daemon itself
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        print("taken", flush=True)
        return
    listener.listen(64)  # a launcher's request waits here while the imports below run
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    sys.path[:] = path
    preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through the wakeup fd
    clients: dict[int, socket.socket] = {}
    closing = [listener.fileno(), watch, wake_r, wake_w]
    while True:
        ready = select.select([listener.fileno(), watch, wake_r], [], [])[0]
        if watch in ready:
            return
        if wake_r in ready:
            os.read(wake_r, 512)
        _reap(clients)
        if listener.fileno() in ready:
            _accept(listener, closing, clients)


if __name__ == "__main__":
    serve(b"\0" + sys.argv[1].encode(), int(sys.argv[2]), json.loads(sys.argv[3]))
