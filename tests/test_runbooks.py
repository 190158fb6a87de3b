"""Every command of docs/runbooks/ runs, as written, on the demo layout; compose's are checked.

Each page's ```bash / ```python blocks run in one bash process after the README's setup
block, in the page's order, as an on-call engineer would paste them:

* **demo** (the blocks for both stacks and the demo's): in a checkout laid out as `make run`
  leaves it (:mod:`runbook_layout`: shards, landing zone, `.airflow/demo-logs/`, a crashed
  writer, no Spark), under ``set -euo pipefail``: every command must succeed, no traceback.
  ``shardsink`` and Python are the real ones; ``airflow`` is the real CLI in one warm process
  (:mod:`shardsink_dev.dagrunner`) on a real SQLite home holding the layout's runs, except
  that commands starting or clearing runs are only parsed (one ``airflow dags test``, a
  no-op run, is made by the fixture: its log is the demo log the pages search);
* **compose** (the compose stack's blocks): after the compose setup block, starting from the
  variables the demo run assigned (``RUN``, ``DESC``, …: real values), with ``docker`` and
  ``curl`` stand-ins (:mod:`runbook_shims`) that check service names, container paths and
  mounts against docker-compose.yaml and API calls against Airflow's OpenAPI documents;
  ``airflow`` inside the stack goes to the same warm CLI, ``shardsink`` is parsed by its own
  parser, Python code compiled. The blocks for both stacks ran on the demo already.

Scripts (docs/runbooks/scripts/) run through the pages; the probe script also against S3.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from runbook_layout import (
    DAG,
    REPO,
    RUNBOOKS,
    AirflowServer,
    blocks,
    build_shards,
    crash_a_writer,
    pages,
    serve,
    setup_block,
    shim,
    wrapper,
)

from shardsink import errors
from shardsink_dev.testing import MotoServer

#: What a page's demo run must print (besides running clean).
EXPECT = {
    "README.md": ["nothing to do: nothing new is complete"],
    "failed-writer.md": ["still_possible", "in flight parts/", "may still commit", "exit 2: nothing deleted"],
    "upper-not-advancing.md": ["watermark     1704240000000", "nothing to do: nothing new is complete"],
    "what-did-run-x-commit.md": ['"writer": "airflow:example_ingest/manual__', "attempt_1.mint"],
    "shard-growing.md": ['"in_flight": 3', "cannot_commit", "bound:"],
    "reclocked-source.md": ["-remap", "bindings"],
    "unsafe-store.md": ["is not on S3: nothing to probe"],
    "drop-shard.md": ["would delete", "refused, nothing deleted", "closed file://", "no shard there any more"],
}


@dataclass
class Demo:
    root: Path
    shims: Path
    server: AirflowServer
    runs: list[str]
    desc: str


def _airflow_env(root: Path) -> dict[str, str]:
    home, demo = root / ".airflow", root / ".demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type":"spark","host":"local[2]"}', "PYTHONWARNINGS": "ignore",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SHARDSINK_DEMO_ROOT": str(demo), "SHARDSINK_LANDING": str(demo / "landing"),
        "SHARDSINK_SHARD": (demo / "shards" / "events").as_uri(),
        "SHARDSINK_VIEW": (demo / "shards" / "events_per_user_day").as_uri(),
    })
    return env


def _ok(got: subprocess.CompletedProcess[str]) -> str:
    why = [ln for ln in (got.stdout + got.stderr).splitlines() if re.search(r"error|Error|Traceback|failed", ln)]
    assert got.returncode == 0, (got.args, "\n".join(why[:40]), got.stdout[-3000:], got.stderr[-3000:])
    return got.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("runbooks")
    root = tmp / "checkout"
    (root / ".venv" / "bin").mkdir(parents=True)
    for name in ("dags", "docs", "docker-compose.yaml"):
        (root / name).symlink_to(REPO / name)
    venv = root / ".venv" / "bin"
    wrapper(venv / "shardsink", str(Path(sys.executable).parent / "shardsink"))
    wrapper(venv / "python", sys.executable)
    shim(venv / "airflow", "airflow")
    shims = tmp / "shims"
    shims.mkdir()
    shim(shims / "docker", "docker")
    shim(shims / "curl", "curl")
    (root / ".airflow" / "demo-logs").mkdir(parents=True)
    now = datetime.now(UTC)
    runs = [f"manual__{(now - timedelta(hours=h)).isoformat()}" for h in (3, 2)]
    url = build_shards(root / ".demo", runs)
    with contextlib.contextmanager(serve)(str(tmp / "af.sock"), _airflow_env(root)) as server:
        _ok(server.airflow(["db", "migrate"]))
        _ok(server.airflow(["dags", "reserialize"]))
        for i, run in enumerate(runs):
            _ok(server.airflow(["dags", "trigger", DAG, "--run-id", run, "--logical-date", f"2024-01-0{i + 2}"]))
        got = server.airflow(["dags", "test", DAG, "2024-01-04"], split=False)
        log = _ok(got)
        (root / ".airflow" / "demo-logs" / "run-3.log").write_text(log)
        found = re.search(r"run_id=(manual__[^\s,]+)", log)
        assert found is not None and "nothing to do: nothing new is complete" in log, log[-3000:]
        run3 = found.group(1)
        desc = crash_a_writer(url, run3)
        yield Demo(root, shims, server, [*runs, run3], desc)


#: Names the setup blocks define: a compose check takes the stack's own, not the demo's.
_SETUP_NAMES = {"DAG", "SHARD", "LANDING", "LOGS", "API", "TOKEN"}
_ASSIGNED = re.compile(r"^\s*(?:for\s+)?([A-Z][A-Z0-9_]*)(?:=|\s+in\s)", re.M)


def _page_script(page: Path, stack: str, carry: Path) -> str:
    """The page's blocks of ``stack`` after its setup block. The demo run ends by saving the
    variables the page assigned to ``carry``; the compose check starts from them (its
    ``RUN``, ``DESC``, … are the demo's), so a compose block is checked with real values."""
    setup = setup_block(stack)
    lines = ["set -euo pipefail", "trap 'echo \"@@ERR line $LINENO (exit $?): $BASH_COMMAND\" >&2' ERR", setup.text]
    if stack == "compose":
        lines = ["set -uo pipefail", setup.text, f". {carry}"]
    names: set[str] = set()
    for b in blocks(page):
        if b.lang not in ("bash", "python") or b.text == setup.text:
            continue
        names |= set(_ASSIGNED.findall(b.text)) - _SETUP_NAMES
        if b.stack != stack and (stack == "compose" or b.stack != "both"):
            continue
        lines.append(f"echo '@@BLOCK {b.page}:{b.line}@@'; echo '@@BLOCK {b.page}:{b.line}@@' >&2")
        lines.append(b.text if b.lang == "bash" else f"py - <<'RUNBOOK_PY'\n{b.text}\nRUNBOOK_PY")
    if stack == "demo":
        lines.append(f"declare -p {' '.join(sorted(names))} > {carry} 2>/dev/null || true" if names else f": > {carry}")
    lines.append("echo '@@PAGE DONE@@'")
    return "\n".join(lines) + "\n"


def _run_page(demo: Demo, page: Path, stack: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    root = tmp / "checkout"
    if not root.exists():
        shutil.copytree(demo.root, root, symlinks=True, ignore=shutil.ignore_patterns("airflow.db*", "dags-test-*"))
    violations = tmp / f"violations-{stack}"
    violations.touch()
    path = os.environ.get("PATH", "")
    env = {"HOME": os.environ.get("HOME", str(tmp)), "LANG": "C.UTF-8", "TERM": "dumb",
           "PATH": f"{demo.shims}{os.pathsep}{path}" if stack == "compose" else path,
           "RUNBOOK_SOCK": str(demo.server.server_address), "RUNBOOK_VIOLATIONS": str(violations),
           "RUNBOOK_REPO": str(REPO)}
    got = subprocess.run(["bash", "-c", _page_script(page, stack, tmp / "carried.sh")], cwd=root, env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    return got, violations.read_text().splitlines()


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_the_page_runs_on_the_demo_and_matches_the_compose_stack(demo: Demo, page: Path, tmp_path: Path) -> None:
    got, violations = _run_page(demo, page, "demo", tmp_path)
    out = got.stdout + got.stderr
    where = (f"{page.name} (demo): exit {got.returncode}\n--- stdout\n{got.stdout[-6000:]}\n--- stderr\n"
             f"{got.stderr[-6000:]}")
    assert got.returncode == 0 and "@@PAGE DONE@@" in got.stdout, where
    assert "Traceback" not in out and "usage:" not in out and not violations, where
    for text in EXPECT.get(page.name, []):
        assert text in out, f"{page.name}: expected {text!r}\n{where}"
    if page.name == "drop-shard.md":
        events = tmp_path / "checkout" / ".demo" / "shards" / "events"
        assert not list(events.rglob("*.json")) and not list(events.rglob("*.parquet")), "the shard is gone"
        assert list((tmp_path / "checkout" / ".demo" / "landing").rglob("*.parquet")), "its landing zone is not"

    got, violations = _run_page(demo, page, "compose", tmp_path)
    where = f"{page.name} (compose):\n--- stdout\n{got.stdout[-4000:]}\n--- stderr\n{got.stderr[-6000:]}"
    assert "@@PAGE DONE@@" in got.stdout and not violations, f"{violations}\n{where}"
    for bad in ("command not found", "unbound variable", "syntax error", "jq: error", "Traceback", "usage:"):
        assert bad not in got.stderr, f"{bad!r}\n{where}"


def test_every_block_is_tagged_and_belongs_to_its_stack() -> None:
    """Code is ```bash or ```python (sample output ```text); a block using the compose stack
    (docker compose, the container paths, the REST API) is marked compose, one using the demo's
    files or helpers demo; every block parses."""
    for page in pages():
        for b in blocks(page):
            assert b.lang in ("bash", "python", "text"), f"{page.name}:{b.line}: fence without bash/python/text"
            if b.lang != "bash":
                continue
            uses_compose = re.search(r"docker compose|\bapi\b|\$API|/opt/airflow|curl ", b.text)
            uses_demo = re.search(r"\$LOGS/|runlog|\.airflow/|\.demo/", b.text)
            if b.stack == "both":
                assert not uses_compose and not uses_demo, f"{page.name}:{b.line}: mark it <!-- stack: ... -->"
            got = subprocess.run(["bash", "-n", "-c", b.text], capture_output=True, text=True)
            assert got.returncode == 0, f"{page.name}:{b.line}: {got.stderr}"


def test_every_script_is_run_by_a_page() -> None:
    used = "\n".join(b.text for p in pages() for b in blocks(p) if b.lang == "bash")
    scripts = sorted((RUNBOOKS / "scripts").glob("*.py"))
    assert scripts
    for s in scripts:
        assert f"docs/runbooks/scripts/{s.name}" in used, f"{s.name} is run by no runbook block"


def test_the_exit_code_list_names_every_exit_code_of_the_cli() -> None:
    """README's table lists every code the CLI can return (errors.py, verify, cli.run) and 5's procedure."""
    from shardsink.maintenance.verify import EXIT_PROBLEMS

    codes = {0, 1, 130, EXIT_PROBLEMS} | {c.exit_code for c in vars(errors).values()
                                          if isinstance(c, type) and issubclass(c, errors.ShardsinkError)}
    text = (RUNBOOKS / "README.md").read_text()
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", text, flags=re.M)}
    assert codes <= listed, f"exit codes missing from the runbooks' list: {sorted(codes - listed)}"
    assert "### Exit 5: the fate is unknown" in text and "never retry blindly" in text


def test_the_probe_script_probes_an_s3_bucket(moto: MotoServer) -> None:
    moto.make_bucket(BUCKET := "runbook-probe")
    script = (RUNBOOKS / "scripts" / "probe.py").read_text()
    got = subprocess.run([sys.executable, "-", f"s3://{BUCKET}/shards/x"], input=script, capture_output=True,
                         text=True, timeout=120, env={**os.environ})
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0].startswith("endpoint http://127.0.0.1") and lines[0].endswith(f"bucket {BUCKET}"), got.stdout
    assert lines[1].endswith((" 200", " 412 PreconditionFailed")), got.stdout  # it may create the object
    assert [ln.rsplit(" ", 2)[1:] for ln in lines[2:]] == [["412", "PreconditionFailed"]] * 2, got.stdout
