"""The README's "Your own dataset, on the demo stack", followed verbatim from a fresh Airflow home.

The section's blocks run as a newcomer pastes them: its environment line (``eval "$(make -s
dev-env)"``, with ``DEV_HOME`` / ``DEV_DAGS`` pointing at a fresh home and DAG folder, as the
README offers), ``airflow db migrate``, its DAG saved unchanged in that DAG folder, then its run
block: ``airflow dags test`` (one real run, Spark ``local[2]`` through the connection the
environment defines) and ``shardsink log``. ``HOME`` is a temporary folder holding the landing
zone the snippet reads (``~/my_dataset/landing``): one day of synthetic files on the snippet's
``start_date`` and the watermark at its end. ``airflow`` goes to one warm CLI process
(:mod:`shardsink_dev.dagrunner`: Airflow's own parser and commands).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from af_helpers import DAY, assert_exactly_once, assert_no_leaks

from shardsink import Shard
from shardsink.core.commits import AppendCommit
from shardsink_dev import dagrunner
from shardsink_dev.synthetic import generate

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from runbook_layout import blocks  # noqa: E402

SECTION = "## Your own dataset, on the demo stack"


def _section_blocks() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1
    return [(b.lang, b.text) for b in blocks(REPO / "README.md") if first <= b.line <= last
            and b.lang in ("bash", "python")]


def _lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if shlex.split(ln, comments=True)]


def test_the_readme_own_dataset_section_commits_the_day_exactly_once_from_a_fresh_home(tmp_path: Path) -> None:
    (setup_lang, setup), (dag_lang, dag_py), (run_lang, run) = _section_blocks()
    assert (setup_lang, dag_lang, run_lang) == ("bash", "python", "bash")
    env_line, migrate = _lines(setup)
    assert "make -s dev-env" in env_line and shlex.split(migrate, comments=True) == ["airflow", "db", "migrate"]
    home, af_home, dags = tmp_path / "user", tmp_path / "airflow", tmp_path / "dags"
    home.mkdir()
    dags.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SHARDSINK", "DEV_", "MAKE"))}
    base.update({"HOME": str(home), "DEV_HOME": str(af_home), "DEV_DAGS": str(dags), "PYTHONWARNINGS": "ignore"})
    dumped = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{env_line}\nenv -0"], cwd=REPO, env=base,
                            capture_output=True, text=True, check=True).stdout
    env = dict(item.split("=", 1) for item in dumped.split("\0") if "=" in item)
    assert env["AIRFLOW_HOME"] == str(af_home) and env["AIRFLOW__CORE__DAGS_FOLDER"] == str(dags)
    assert not af_home.exists(), "a fresh Airflow home"

    m = re.search(r"start_date=datetime\((\d+), (\d+), (\d+), tzinfo=UTC\)", dag_py)
    assert m is not None, "the snippet's start_date"
    year, month, day = (int(g) for g in m.groups())
    lower = int(datetime(year, month, day, tzinfo=UTC).timestamp() * 1000)
    landing = home / "my_dataset" / "landing"
    rows = generate(str(landing), start=lower, days=1, files_per_day=3, rows_per_file=200)[0]
    (dags / "my_dataset_ingest.py").write_text(dag_py)

    t0 = time.monotonic()
    done = dagrunner.airflow(env, ["db", "migrate"], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    t_migrate = time.monotonic() - t0
    runs: list[tuple[str, float, str]] = []
    for line in _lines(run):
        words = shlex.split(line, comments=True)
        t = time.monotonic()
        if words[0] == "airflow":
            got = dagrunner.airflow(env, words[1:], timeout=600)
        else:
            got = subprocess.run(["bash", "-euo", "pipefail", "-c", line], env=env, capture_output=True, text=True,
                                 timeout=120)
        out = got.stdout + got.stderr
        assert got.returncode == 0 and "Traceback" not in out, f"{line}\n{out[-6000:]}"
        runs.append((line, time.monotonic() - t, out))
    (test_line, t_run, test_out), (_, _, log_out) = runs
    assert "max_chain" not in test_out, "the snippet's shard starts at its data: no far-behind warning"

    url = str(home / "my_dataset" / "shard")
    shard = Shard.open(url)
    appends = [c for _, c in shard.log() if isinstance(c, AppendCommit)]
    assert len(appends) == 1 and (appends[0].lower, appends[0].upper) == (lower, lower + DAY), appends
    assert appends[0].rows == rows and shard.info().upper == lower + DAY
    assert_exactly_once(url, str(landing), lower, lower + DAY)
    assert_no_leaks(url)
    assert "append" in log_out and f"{lower + DAY}" in log_out

    # "Run the same command again: nothing to do, no Spark job starts."
    seqno, t = shard.info().seqno, time.monotonic()
    again = dagrunner.airflow(env, shlex.split(test_line, comments=True)[1:], timeout=600)
    t_again = time.monotonic() - t
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout[-3000:]
    assert "spark-submit" not in again.stdout and Shard.open(url).info().seqno == seqno
    print(f"\nREADME own dataset: db migrate {t_migrate:.1f}s, {test_line!r} {t_run:.1f}s ({rows} rows), "
          f"re-run {t_again:.1f}s, total {time.monotonic() - t0:.1f}s")
