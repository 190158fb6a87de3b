"""Every ```bash / ```python block of README.md runs, as written, in some test.

* ``make`` and ``docker compose`` blocks name exactly the Makefile targets and compose
  services that exist (running them is the whole suite or a Docker engine);
* the "Your own dataset" section's blocks run, verbatim, in one real ``airflow dags test``
  (tests/airflow/test_readme_own_dag.py); here, the environment it shows is exactly what
  ``make -s dev-env`` prints;
* every other bash block runs under ``bash -euo pipefail`` in an empty folder, with the venv's
  ``shardsink``; every other python block runs in order in one interpreter (each in a fresh
  namespace, sharing the folder: the readers read the Python API's shard), and a ``print(...)``
  line whose comment is a Python literal must print exactly that value.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from runbook_layout import Block, blocks

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
OWN_SECTION = "## Your own dataset, on the demo stack"
PLACEHOLDER = "/path/to/shardsink"


def section_of(block: Block) -> str:
    """The ``## `` heading the block sits under."""
    lines = README.read_text().splitlines()[:block.line]
    return next((ln for ln in reversed(lines) if ln.startswith("## ")), "")


def code_blocks(lang: str) -> list[Block]:
    return [b for b in blocks(README) if b.lang == lang]


def commands(block: Block) -> list[list[str]]:
    """The block's commands as words, comments dropped."""
    return [w for ln in block.text.splitlines() if (w := shlex.split(ln, comments=True))]


def kind(block: Block) -> str:
    if section_of(block) == OWN_SECTION:
        return "own"
    words = commands(block)
    if block.lang == "bash" and words and all(w[0] == "make" for w in words):
        return "make"
    if block.lang == "bash" and words and all(w[:2] == ["docker", "compose"] for w in words):
        return "compose"
    return block.lang


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK", "AWS_"))}
    env.update({"HOME": str(tmp / "home"), "AIRFLOW_HOME": str(tmp / "airflow"), "PYTHONWARNINGS": "ignore",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    (tmp / "home").mkdir(exist_ok=True)
    return env


def test_every_block_is_bash_python_or_output_and_each_has_a_runner() -> None:
    kinds = [(b.line, b.lang, kind(b)) for b in blocks(README)]
    assert all(lang in ("bash", "python", "text", "") for _, lang, _ in kinds), kinds
    own = [k for _, lang, k in kinds if k == "own" and lang in ("bash", "python")]
    assert len(own) == 3, f"the own-dataset section: setup, the DAG, the run ({kinds})"
    assert {"make", "compose", "bash", "python"} <= {k for _, _, k in kinds}


def test_make_blocks_name_existing_targets_and_make_test_is_the_test_command() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = [w for b in code_blocks("bash") if kind(b) == "make" for w in commands(b)]
    assert named, "the Quickstart's make commands"
    for words in named:
        assert len(words) == 2 and words[1] in targets, f"{words}: not a Makefile target ({sorted(targets)})"
    assert ["make", "test"] in named and ["make", "run"] in named
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), ".ci/run runs the suite the README names"


def test_compose_blocks_name_existing_services() -> None:
    spec = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = set(spec["services"])
    named = [w for b in code_blocks("bash") if kind(b) == "compose" for w in commands(b)]
    assert named
    for words in named:
        assert words[2] in ("up", "down", "ps", "logs", "config", "exec", "restart"), words
        names = [w for w in words[3:] if not w.startswith("-")]
        assert set(names) <= services, f"{words}: unknown services {set(names) - services}"


def test_dev_env_prints_exactly_the_environment_the_readme_shows(tmp_path: Path) -> None:
    own = [b for b in blocks(README) if section_of(b) == OWN_SECTION and b.lang == "text"]
    assert len(own) == 1
    shown = own[0].text.replace(PLACEHOLDER, str(REPO))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEV_", "MAKE"))}
    make = ["make", "-s", "--no-print-directory", "dev-env"]
    got = subprocess.run(make, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert got.strip() == shown.strip()
    moved = subprocess.run([*make, f"DEV_HOME={tmp_path}/h", f"DEV_DAGS={tmp_path}/d"], cwd=REPO, env=env,
                           capture_output=True, text=True, check=True).stdout
    printed = subprocess.run(["bash", "-c", f'{moved}\nprintf "%s\\n" "$AIRFLOW_HOME" "$AIRFLOW__CORE__DAGS_FOLDER" '
                                        '"$AIRFLOW_CONN_SPARK_DEFAULT"'], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert printed == [f"{tmp_path}/h", f"{tmp_path}/d", '{"conn_type":"spark","host":"local[2]"}']


@pytest.mark.parametrize("block", [b for b in code_blocks("bash") if kind(b) == "bash"], ids=lambda b: f"line{b.line}")
def test_bash_block_runs(block: Block, tmp_path: Path) -> None:
    got = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    out = got.stdout + got.stderr
    assert got.returncode == 0 and "Traceback" not in out, f"README.md:{block.line}\n{out[-4000:]}"
    if "shardsink snapshot events --as-of 2026-11-26T23:59:59" in block.text:  # the worked example's comment
        assert '{"user": "ann", "amount": 3, "_count": 1}\n{"user": "bob", "amount": 4, "_count": 1}' in got.stdout


_RUNNER = r"""
import ast, contextlib, io, json, sys
out = []
for name, text in json.load(sys.stdin):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(text, name, "exec"), {"__name__": "__readme__"})
    out.append(buf.getvalue())
print(json.dumps(out))
"""


def _expected_prints(text: str) -> list[object | None]:
    """Per ``print(...)`` line of ``text``: the literal its comment states, or None."""
    want: list[object | None] = []
    for ln in text.splitlines():
        if not ln.lstrip().startswith("print("):
            continue
        comment = ln.split("  # ", 1)[1].strip() if "  # " in ln else ""
        try:
            want.append(ast.literal_eval(comment))
        except (ValueError, SyntaxError):
            want.append(None)
    return want


def test_python_blocks_run_in_order_and_print_what_their_comments_say(tmp_path: Path) -> None:
    todo = [b for b in code_blocks("python") if kind(b) in ("python", "own")]
    assert len(todo) >= 5
    got = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([(f"README.md:{b.line}", b.text)
                                                                            for b in todo]),
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-4000:]
    printed = json.loads(got.stdout.splitlines()[-1])
    for b, out in zip(todo, printed, strict=True):
        want = _expected_prints(b.text)
        lines = out.splitlines()
        assert len(lines) == len(want), (b.line, lines)
        for line, value in zip(lines, want, strict=True):
            if value is not None:
                assert ast.literal_eval(line) == value, f"README.md:{b.line}: printed {line}, comment {value!r}"
