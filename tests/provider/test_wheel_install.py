"""A fresh, non-editable install of the project's wheel makes Airflow list the provider and its plugin.

The wheel is built by uv from a copy of the sources (build isolation; uv is how ``make`` installs
the project; a build inside the repository would leave ``plugins/shardsink.egg-info``
behind: a second copy of the entry points). It goes into a NEW venv (no pip, no Airflow:
installing Airflow afresh takes minutes), whose dependencies come from this test's venv
through a folder of links to each entry of its site-packages EXCEPT shardsink's own (the
editable install's dist-info and path file). SUBTLE: ``importlib.metadata.distribution()``
and ``entry_points()`` keep the first copy of a name on sys.path, but ``distributions()``
lists every copy and Airflow's entry point scan iterates it without deduplicating, so
pointing the new venv at this site-packages itself would let the editable install's
metadata in. Airflow then runs from a folder outside the repository, with an empty
plugins folder and no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from shardsink.provider import PACKAGE

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
UV = Path(sys.executable).parent / "uv"  # installed into the venv by `make venv`


def _run(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert r.returncode == 0, f"{args}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r.stdout


def _json_list(out: str) -> list[dict[str, object]]:
    return list(json.loads(out[out.index("["):out.rindex("]") + 1]))


def _venv_with_the_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copytree(REPO / "plugins" / "shardsink", src / "plugins" / "shardsink",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # uv, the Makefile's installer (its own build isolation, the same setuptools backend): 2.4 CPU-s
    # against pip's 8.7 for the wheel, 0.1 against 2.4 for the install.
    _run([str(UV), "build", "--wheel", "-q", "-o", str(tmp / "dist"), str(src)])
    [wheel] = (tmp / "dist").glob("shardsink-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([str(UV), "pip", "install", "--no-deps", "-q", "--python", str(python), str(wheel)])
    deps = tmp / "deps"
    deps.mkdir()
    for sp in {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}:
        for entry in sp.iterdir():
            if entry.name.startswith((PACKAGE, "__editable__")) or entry.suffix == ".pth":
                continue
            if not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "_test_deps.pth").write_text(f"{deps}\n")
    return venv


def test_a_fresh_wheel_install_makes_airflow_list_the_provider_and_its_plugin(tmp_path: Path) -> None:
    venv = _venv_with_the_wheel(tmp_path)
    python = str(venv / "bin" / "python")
    outside = tmp_path / "cwd"
    for d in ("cwd", "home", "no-plugins", "no-dags"):
        (tmp_path / d).mkdir()
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "no-plugins"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "no-dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "PYTHONWARNINGS": "ignore"}
    probe = ("import json, importlib.metadata as m, shardsink; print(json.dumps({'file': shardsink.__file__, "
             "'dists': [str(d._path) for d in m.distributions() if d.metadata['Name'] == 'shardsink']}))")
    seen = json.loads(_run([python, "-c", probe], env=env, cwd=outside))
    assert Path(seen["file"]).is_relative_to(venv), seen  # the installed copy, not the repository's
    assert [Path(d).parent for d in seen["dists"]] == [Path(seen["file"]).parents[1]], seen  # one copy of the metadata

    providers = {p["package_name"]: p for p in _json_list(_run([python, "-m", "airflow", "providers", "list",
                                                                "-o", "json"], env=env, cwd=outside))}
    assert providers[PACKAGE]["version"] == VERSION, providers.get(PACKAGE)
    r = subprocess.run([python, "-m", "airflow", "plugins", "-o", "json"], env=env, cwd=outside, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    plugins = {p["name"]: p for p in _json_list(r.stdout)}
    mine = plugins["shardsink"]
    assert str(mine["source"]).startswith(f"shardsink=={VERSION}: EntryPoint(name='shardsink'"), mine["source"]
    assert [a["url_prefix"] for a in mine["fastapi_apps"]] == ["/shardsink"]  # type: ignore[attr-defined]
    assert "already registered" not in r.stdout + r.stderr
