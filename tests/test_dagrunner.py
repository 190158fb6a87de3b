"""The warm ``airflow`` runners of the Airflow tests (shardsink_dev/dagrunner.py): a runner forked
from the zygote reads its own Airflow home and metadata DB, not the zygote's or another runner's;
closing it ends it as an interpreter ends, so its SQLite DB is whole in its main file (the
Airflow tests copy a template DB made this way); a request whose interpreter-start variables
differ from the zygote's gets an interpreter of its own; a runner that ends before it connects fails
its request at once."""

from __future__ import annotations

import os
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest

from shardsink_dev import dagrunner
from tests.airflow.af_helpers import base_env


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def test_forked_runners_read_their_own_home_and_leave_a_whole_db(tmp_path: Path) -> None:
    """... and their CPU reaches this process's children's times once the zygote ends (the
    suite's ``time`` counts it)."""
    a, b = base_env(tmp_path / "a"), base_env(tmp_path / "b")
    before, runners_cpu = _children_cpu_s(), 0.0
    try:
        migrated = dagrunner.airflow(a, ["db", "migrate"], timeout=300)
        assert migrated.returncode == 0, migrated.stdout[-3000:]
        conn = dagrunner.airflow(b, ["config", "get-value", "database", "sql_alchemy_conn"], timeout=300)
        assert conn.returncode == 0, conn.stdout[-3000:]
        assert conn.stdout.strip().splitlines()[-1] == f"sqlite:///{tmp_path / 'b'}/airflow.db"
        runners = list(dagrunner._RUNNERS.values())
        zygotes = {z.pid for z in dagrunner._ZYGOTES.values()}
        assert len(runners) == 2 and len(zygotes) == 1, "both runners share one zygote"
        assert all(_parent(r.pid) in zygotes for r in runners), "a runner was not forked from the zygote"
        runners_cpu = sum(_cpu_s(r.pid) for r in runners)
        # A runner that ends before it connects (here: its stderr file cannot be opened) fails the
        # request at once and leaves no socket folder behind.
        (tmp_path / "d" / "dagrunner.err").mkdir(parents=True)
        folders, t0 = set(Path(tempfile.gettempdir()).glob("dagrunner-*")), time.monotonic()
        with pytest.raises(RuntimeError, match="ended before it connected"):
            dagrunner.airflow(base_env(tmp_path / "d"), ["version"], timeout=300)
        assert time.monotonic() - t0 < 60 and set(Path(tempfile.gettempdir()).glob("dagrunner-*")) == folders
    finally:
        dagrunner.close_all()
        dagrunner.stop_zygotes()
    assert _children_cpu_s() - before >= runners_cpu > 1, "the runners' CPU was lost to the accounting"
    assert not (tmp_path / "a" / "airflow.db-wal").exists(), "the runner left its write-ahead log unmerged"
    with sqlite3.connect(tmp_path / "a" / "airflow.db") as db:
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


def test_a_request_with_its_own_pythonpath_gets_its_own_interpreter(tmp_path: Path) -> None:
    env = {**base_env(tmp_path / "c"), "PYTHONPATH": str(tmp_path)}
    try:
        got = dagrunner.airflow(env, ["config", "get-value", "core", "load_examples"], timeout=300)
        assert got.returncode == 0, got.stdout[-3000:]
        (runner,) = dagrunner._RUNNERS.values()
        assert _parent(runner.pid) == os.getpid(), "a PYTHONPATH request must not be forked from the zygote"
    finally:
        dagrunner.close_all()
