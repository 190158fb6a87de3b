"""``import shardsink.read`` needs neither engine; a read with a missing engine names the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import scenarios
import test_duckdb
import test_polars

PROBE = """
import sys
import shardsink.read as r
assert "duckdb" not in sys.modules and "polars" not in sys.modules, "imported an engine"
from shardsink import InvalidUsageError
for name, call in (("duckdb", lambda: r.duckdb(None, "file:///x/y")), ("polars", lambda: r.polars("file:///x/y"))):
    assert not r.engine_available(name)
    try:
        call()
    except InvalidUsageError as e:
        assert f"shardsink[{name}]" in str(e), str(e)
    else:
        raise AssertionError("no error")
print("ok")
"""


def test_import_needs_no_engine_and_a_missing_engine_names_its_extra(tmp_path: Path) -> None:
    for name in ("duckdb", "polars"):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"raise ImportError('No module named {name} (shadowed by the test)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_paths_with_glob_characters_are_read_literally(tmp_path: Path) -> None:
    """A shard folder named like a pattern: DuckDB falls back to a pyarrow dataset, Polars
    reads without globbing; both still read exactly the planned parts."""
    for i, engine in enumerate((test_duckdb.ENGINE, test_polars.ENGINE)):
        odd = tmp_path / f"we[i]rd*{{x}}-{i}"
        odd.mkdir()
        scenarios.floats_without_nulls_are_normalised(engine, f"file://{odd}/s")
