"""shardsink.spark.forkserver: a JVM's Python worker daemons are forked by one warm fork server,
each with its launcher's own streams and environment, and end as pyspark's daemon does; where no
fork server can run, the launcher runs the daemon itself.

The launchers here are started as a Spark JVM starts them (``python -m shardsink.spark.daemon``
on pipes), from a stand-in JVM process, so the fork server's parent is known and ends with it.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shardsink.spark.forkserver import PER_DAEMON, launch, server_name

#: A stand-in JVM for daemon module ``argv[1]``: ``start DIR`` starts a launcher with its daemon's Unix socket in DIR (a
#: per-daemon variable, as Spark sets it) and prints its pid and the socket path the daemon wrote;
#: ``close N`` closes launcher N's stdin, ``term N`` SIGTERMs it (as ``Process.destroy`` does);
#: both print its exit code.
JVM = textwrap.dedent("""
    import os, struct, subprocess, sys
    procs = []
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "start":
            env = dict(os.environ, PYTHON_UNIX_DOMAIN_ENABLED="true", PYTHON_WORKER_FACTORY_SOCK_DIR=arg)
            p = subprocess.Popen([sys.executable, "-m", sys.argv[1]], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env)
            procs.append(p)
            size = struct.unpack("!i", p.stdout.read(4))[0]
            print(p.pid, p.stdout.read(size).decode(), flush=True)
        elif cmd == "close":
            p = procs[int(arg)]; p.stdin.close(); print(p.wait(60), flush=True)
        elif cmd == "term":
            p = procs[int(arg)]; p.terminate(); print(p.wait(60), flush=True)
""")


class Jvm:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def say(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()


@contextmanager
def stand_in_jvm(daemon_module: str, cwd: Path) -> Iterator[Jvm]:
    proc = subprocess.Popen([sys.executable, "-c", JVM, daemon_module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=cwd, env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST")})
    try:
        yield Jvm(proc)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def jvm(tmp_path: Path) -> Iterator[Jvm]:
    with stand_in_jvm("shardsink.spark.daemon", tmp_path) as j:
        yield j


def _processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _children(pid: int) -> list[int]:
    return [p for p in _processes() if _parent(p) == pid]


def _args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _ended(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])  # a pidfd turns readable when its process ends
    finally:
        os.close(fd)


def test_a_jvms_daemons_are_forked_by_one_server_with_their_own_env_and_end_as_pyspark_says(
        jvm: Jvm, tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="fs-"))  # a socket's path has at most 107 bytes
    dirs = [short / "one", short / "two"]
    started = []
    for d in dirs:
        d.mkdir()
        pid, sock = jvm.say(f"start {d}").split()
        started.append(int(pid))
        assert Path(sock).parent == d, "the daemon ran with its own launcher's per-daemon variables"

    # The fork server and its children (forked: the same command line), the server the one whose
    # parent is none of them.
    forked = {p for p in _processes() if _args(p)[2:3] == ["shardsink.spark.forkserver"]
              and _args(p)[4] == str(jvm.proc.pid)}
    servers = [p for p in forked if _parent(p) not in forked]
    assert len(servers) == 1, "one fork server for the JVM's two daemons"
    daemons = _children(servers[0])
    assert len(daemons) == 2 and set(daemons) == forked - set(servers), "both daemons are the fork server's children"
    # A launcher's only child is the fork server it started (the first one): it ran no daemon itself.
    assert all(set(_children(launcher)) <= set(servers) for launcher in started)
    for daemon in daemons:
        assert Path(f"/proc/{daemon}/cwd").resolve() == tmp_path.resolve()

    # pyspark's daemon protocol, through the launcher: stdin closed or SIGTERM end the daemon, and
    # the launcher exits as pyspark's own daemon does.
    with stand_in_jvm("pyspark.daemon", tmp_path) as own:
        (short / "own").mkdir()
        own.say(f"start {short / 'own'}")
        own.say(f"start {short / 'own'}")
        expected = own.say("close 0"), own.say("term 1")
    assert (jvm.say("close 0"), jvm.say("term 1")) == expected
    assert all(_ended(daemon, 30) for daemon in daemons)
    jvm.proc.kill()
    jvm.proc.wait()
    assert _ended(servers[0], 30), "the fork server ends with its JVM"
    shutil.rmtree(short)


def test_without_a_fork_server_the_launcher_is_told_to_run_the_daemon_itself() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert launch(parent=dead.pid) is None  # its server finds no JVM to serve, says nothing, exits


def test_the_servers_name_ignores_per_daemon_variables_only() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/x"}
    name = server_name(executable="/py", path=["/a"], env=base, parent=7)
    assert name == server_name(executable="/py", path=["/a"], env={**base, **dict.fromkeys(PER_DAEMON, "s")},
                               parent=7)
    for other in (server_name(executable="/py2", path=["/a"], env=base, parent=7),
                  server_name(executable="/py", path=["/b"], env=base, parent=7),
                  server_name(executable="/py", path=["/a"], env={**base, "OMP_NUM_THREADS": "1"}, parent=7),
                  server_name(executable="/py", path=["/a"], env=base, parent=8)):
        assert other != name
    assert name.startswith(b"\0")
