"""``shardsink snapshot|changes --engine duckdb``: the real console script prints exactly what
the default (pyarrow) read prints, on a local folder and S3; without DuckDB installed it
exits 2 naming the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import Shard
from shardsink.core.schema import SchemaChange

_SCRIPT = Path(sys.executable).with_name("shardsink")
SHARDSINK = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "shardsink"]


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDSINK, *args], env=env, capture_output=True, text=True, timeout=120)


def _filled(url: str) -> None:
    """Retractions, a zero sum, -0.0 and NaN in a float column, two batches."""
    shard = Shard.create(url, pa.schema([("k", pa.string()), ("x", pa.float64())]))
    shard.append(pa.table({"k": ["a", "b", "a", "c"], "x": [1.5, -0.0, 1.5, float("nan")], "_time": [0, 5, 7, 8]}),
                 lower=0, upper=10)
    shard.append(pa.table({"k": ["a", "b", "c"], "x": [1.5, 0.0, float("nan")], "_time": [15, 12, 19],
                           "_diff": [-1, -1, 2]}), lower=10, upper=20)


def test_engine_duckdb_prints_what_the_default_read_prints(backend: str, shard_url: str, tmp_path: Path) -> None:
    _filled(shard_url)
    env = dict(os.environ)
    reads = [("snapshot", shard_url),
             ("changes", shard_url, "--from", "0", "--to", "20"), ("changes", shard_url, "--from", "6", "--to", "16",
                                                                   "--format", "csv")]
    for args in reads:
        want, got = _run(env, *args), _run(env, *args, "--engine", "duckdb")
        assert want.returncode == got.returncode == 0, got.stderr
        assert got.stdout == want.stdout and got.stdout, args
    for engine in ("pyarrow", "duckdb"):
        assert _run(env, "snapshot", shard_url, "--engine", engine, "--output", str(tmp_path / f"{engine}.parquet")
                    ).returncode == 0
    got_t, want_t = pq.read_table(tmp_path / "duckdb.parquet"), pq.read_table(tmp_path / "pyarrow.parquet")
    assert got_t.schema == want_t.schema and repr(got_t.to_pylist()) == repr(want_t.to_pylist())  # NaN != NaN
    bad = _run(env, "snapshot", shard_url, "--engine", "duckdb", "--as-of", "20")
    assert bad.returncode == 2 and "as_of 20 is not readable" in bad.stderr
    assert not Shard(shard_url).leases()                           # every lease released


def _evolved(url: str) -> None:
    """Add ``note`` at 10, rename ``k`` to ``key`` at 20, widen ``n`` to int64 and drop ``z`` at 30."""
    s = Shard.create(url, pa.schema([("k", pa.string()), ("n", pa.int32()), ("z", pa.string())]))
    s.append(pa.table({"k": ["a", "b"], "n": pa.array([1, 2], pa.int32()), "z": ["p", None], "_time": [0, 3]}),
             lower=0, upper=10)
    s.evolve(SchemaChange(kind="add", name="note", type="string"))
    s.append(pa.table({"k": ["a", "c"], "n": pa.array([1, 3], pa.int32()), "z": ["p", "r"], "note": [None, "n3"],
                       "_time": [12, 15], "_diff": [-1, 1]}), lower=10, upper=20)
    s.evolve(SchemaChange(kind="rename", name="k", new_name="key"))
    s.append(pa.table({"key": ["d"], "n": pa.array([4], pa.int32()), "z": ["s"], "note": ["n4"], "_time": [22]}),
             lower=20, upper=30)
    s.evolve(SchemaChange(kind="widen", name="n", type="int64"))
    s.evolve(SchemaChange(kind="drop", name="z"))
    s.append(pa.table({"key": ["e"], "n": [2**40], "note": ["n5"], "_time": [33]}), lower=30, upper=40)


def test_engine_duckdb_schema_as_of_prints_what_the_default_read_prints(tmp_path: Path) -> None:
    """``--schema as_of`` (the columns current at the read's time, by field id) through DuckDB:
    the same bytes as the pyarrow read, in the old column names with the later-dropped column.
    (Local only: the console script's S3 path is the test above; the engines' as_of reads run on
    S3 in tests/read.)"""
    shard_url = f"file://{tmp_path}/s"
    _evolved(shard_url)
    env = dict(os.environ)
    reads = [("snapshot", shard_url, "--as-of", "15", "--format", "csv"),
             ("changes", shard_url, "--from", "0", "--to", "25")]
    outs = []
    for args in reads:
        want, got = _run(env, *args, "--schema", "as_of"), _run(env, *args, "--schema", "as_of", "--engine", "duckdb")
        assert want.returncode == got.returncode == 0, got.stderr
        assert got.stdout == want.stdout and got.stdout, args
        outs.append(got.stdout)
    assert outs[0].splitlines()[0] == '"k","n","z","note","_count"', outs[0]   # as of 15: k not yet renamed
    assert json.loads(got.stdout.splitlines()[0]) == {"key": "a", "n": 1, "z": "p", "note": None, "_time": 0,
                                                      "_diff": 1}, got.stdout
    assert not Shard(shard_url).leases()


def test_engine_duckdb_without_duckdb_exits_2_naming_the_extra(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    _filled(url)
    shadow = tmp_path / "shadow" / "duckdb"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named duckdb (shadowed by the test)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    r = _run(env, "snapshot", url, "--engine", "duckdb")
    assert r.returncode == 2 and "shardsink[duckdb]" in r.stderr, r.stderr
    assert _run(env, "snapshot", url).returncode == 0               # the default read needs no DuckDB


@pytest.mark.parametrize("engine", ["polars", "spark"])
def test_engine_choices_are_checked(tmp_path: Path, engine: str) -> None:
    url = f"file://{tmp_path}/s"
    _filled(url)
    r = _run(dict(os.environ), "snapshot", url, "--engine", engine)
    assert r.returncode == 2 and "invalid choice" in r.stderr
