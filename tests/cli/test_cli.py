"""The ``shardsink`` command as operators and scripts use it: the real console script in
a subprocess, against a local folder and S3 (moto). Exit codes: 0 ok (also *already
committed*), 2 bad usage or input (nothing written), 3 upper mismatch."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import Shard

_SCRIPT = Path(sys.executable).with_name("shardsink")
SHARDSINK = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "shardsink"]
INSPECT_KEYS = {"seqno", "upper", "since", "batches", "parts", "rows", "bytes", "schema"}
LOG_KEYS = {"seqno", "at", "kind", "writer", "nonce"}  # and each kind's own fields


@dataclass
class Cli:
    """Runs the console script with the backend's environment."""

    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SHARDSINK, *args], env=self.env, cwd=cwd or self.cwd, capture_output=True, text=True, timeout=60
        )

    def ok(self, *args: str, cwd: Path | None = None) -> str:
        r = self.run(*args, cwd=cwd)
        assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr}"
        return r.stdout

    def run_all(self, *calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        """Independent invocations, run concurrently (each is a full process start)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda args: self.run(*args), calls))

    def inspect(self, url: str) -> dict[str, Any]:
        return dict(json.loads(self.ok("inspect", url, "--json")))

    def log(self, url: str, *extra: str) -> list[dict[str, Any]]:
        return list(json.loads(self.ok("log", url, "--json", *extra)))


@pytest.fixture
def cli(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Cli:
    env = dict(os.environ)
    if backend == "s3":
        env.update(request.getfixturevalue("moto").env())
    return Cli(env, tmp_path)


@pytest.fixture
def local_cli(tmp_path: Path) -> Cli:
    return Cli(dict(os.environ), tmp_path)


@dataclass
class Files:
    schema_csv: Path
    schema_jsonl: Path
    schema_parquet: Path
    batch1: Path  # [0, 10) CSV: a:1 @0, b:2 @5, a:1 @7
    batch2: Path  # [10, 20) JSONL: c:3 @12, a:1 retracted @15


@pytest.fixture
def files(tmp_path: Path) -> Files:
    d = tmp_path / "in"
    d.mkdir()
    (d / "schema.csv").write_text("k,v,_time\nx,1,0\n")
    (d / "schema.jsonl").write_text('{"k": "x", "v": 1, "_time": 0, "_diff": 1}\n')
    pq.write_table(
        pa.table({"k": pa.array(["x"], pa.string()), "v": pa.array([1], pa.int64()), "_time": pa.array([0])}),
        d / "schema.parquet",
    )
    (d / "batch1.csv").write_text("k,v,_time\na,1,0\nb,2,5\na,1,7\n")
    (d / "batch2.jsonl").write_text(
        '{"k": "c", "v": 3, "_time": 12, "_diff": 1}\n{"k": "a", "v": 1, "_time": 15, "_diff": -1}\n'
    )
    return Files(d / "schema.csv", d / "schema.jsonl", d / "schema.parquet", d / "batch1.csv", d / "batch2.jsonl")


def filled_by_library(url: str) -> None:
    """create + two appends, in-process (cheaper than three processes): seqno 2, upper 20,
    a:1 @0 and @7 (one retracted @15), b:2 @5, c:3 @12."""
    shard = Shard.create(url, pa.schema([("k", pa.string()), ("v", pa.int64())]))
    shard.append(pa.table({"k": ["a", "b", "a"], "v": [1, 2, 1], "_time": [0, 5, 7]}), lower=0, upper=10,
                 desc_id="d1", writer="dag-a")
    shard.append(pa.table({"k": ["c", "a"], "v": [3, 1], "_time": [12, 15], "_diff": [1, -1]}), lower=10,
                 upper=20, desc_id="d2", writer="dag-b")


def part_objects(url: str) -> list[str]:
    return sorted(o.key for o in Shard(url)._machine.blob.list("parts/"))


# --- entry points -------------------------------------------------------------------------------


def test_python_m_shardsink_help_lists_every_command(local_cli: Cli) -> None:
    calls = [[sys.executable, "-m", "shardsink", "--help"], [*SHARDSINK, "--help"]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True, timeout=60), calls))
    for r in results:
        assert r.returncode == 0, r.stderr
        for sub in ("create", "append", "inspect", "log", "snapshot", "changes"):
            assert sub in r.stdout


def test_usage_errors_exit_2(local_cli: Cli, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/s"
    missing_input, bad_time = local_cli.run_all(
        ("append", url, "--lower", "0", "--upper", "1"), ("snapshot", url, "--as-of", "yesterday-ish")
    )
    assert missing_input.returncode == 2 and "--input" in missing_input.stderr
    assert bad_time.returncode == 2 and "'yesterday-ish' is not a time" in bad_time.stderr


# --- create -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_create_takes_the_user_columns_of_a_schema_file(local_cli: Cli, files: Files, tmp_path: Path,
                                                         fmt: str) -> None:
    url = f"file://{tmp_path}/from-{fmt}"
    out = local_cli.ok("create", url, "--schema-from", str(getattr(files, f"schema_{fmt}")), "--upper", "100")
    assert f"created {url} with upper 100" in out
    info = Shard.open(url).info()
    assert info.schema.equals(pa.schema([("k", pa.string()), ("v", pa.int64())]))
    assert (info.seqno, info.upper, info.since) == (0, 100, 0)


def test_create_twice_exits_2_and_leaves_the_shard(local_cli: Cli, files: Files, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/twice"
    local_cli.ok("create", url, "--schema-from", str(files.schema_csv), "--upper", "5")
    r = local_cli.run("create", url, "--schema-from", str(files.schema_parquet), "--upper", "9")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert (Shard.open(url).info().upper, Shard.open(url).info().seqno) == (5, 0)


# --- append -----------------------------------------------------------------------------------------


def test_append_commits_and_the_same_desc_id_again_is_already_committed(
    cli: Cli, files: Files, shard_url: str
) -> None:
    cli.ok("create", shard_url, "--schema-from", str(files.schema_csv))
    args = ("append", shard_url, "--lower", "0", "--upper", "10", "--input", str(files.batch1), "--desc-id", "d1")
    out = cli.ok(*args)
    assert out.startswith("committed: desc d1 [0, 10) at seqno 1")
    parts = part_objects(shard_url)
    again = cli.run(*args)
    assert again.returncode == 0
    assert again.stdout.startswith("already committed: desc d1")
    assert part_objects(shard_url) == parts and len(parts) == 1
    out = cli.ok("append", shard_url, "--lower", "10", "--upper", "20", "--input", str(files.batch2))
    assert out.startswith("committed: desc ") and "[10, 20) at seqno 2, 2 rows" in out
    d = cli.inspect(shard_url)
    assert (d["seqno"], d["upper"], d["batches"], d["parts"], d["rows"]) == (2, 20, 2, 2, 5)


def test_append_with_stale_lower_exits_3_naming_the_current_upper(cli: Cli, files: Files, shard_url: str) -> None:
    filled_by_library(shard_url)
    before = cli.inspect(shard_url)
    parts = part_objects(shard_url)
    r = cli.run("append", shard_url, "--lower", "0", "--upper", "10", "--input", str(files.batch1))
    assert r.returncode == 3
    assert "current upper 20" in r.stderr and "expected upper 0" in r.stderr
    assert cli.inspect(shard_url) == before
    assert part_objects(shard_url) == parts


def test_bad_input_exits_2_naming_the_problem_and_leaves_the_shard_unchanged(
    cli: Cli, backend: str, files: Files, shard_url: str, tmp_path: Path
) -> None:
    cli.ok("create", shard_url, "--schema-from", str(files.schema_csv))
    cli.ok("append", shard_url, "--lower", "0", "--upper", "10", "--input", str(files.batch1))
    before = cli.inspect(shard_url)
    parts = part_objects(shard_url)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "late.csv").write_text("k,v,_time\na,1,12\na,1,25\n")
    (bad / "malformed.csv").write_text("k,v,_time\na,1\n")
    (bad / "notint.csv").write_text("k,v,_time\na,one,12\n")
    (bad / "nocol.jsonl").write_text('{"k": "a", "_time": 12}\n')
    (bad / "zero.csv").write_text("k,v,_time,_diff\na,1,12,0\n")
    (bad / "data.txt").write_text("k,v,_time\na,1,12\n")
    good = str(files.batch1)  # times 0..7: fine for [0, 10) only
    cases: list[tuple[list[str], str]] = [
        (["--lower", "10", "--upper", "20", "--input", str(bad / "late.csv")], r"times [12, 25] fall outside"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "malformed.csv")], "malformed.csv' as csv"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "missing.csv")], "missing.csv' does not exist"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "notint.csv")], "notint.csv' as csv"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "nocol.jsonl")], "missing ['v']"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "zero.csv")], "'_diff' has 1 zero values"),
        (["--lower", "10", "--upper", "20", "--input", str(bad / "data.txt")], "cannot tell the format"),
        (["--lower", "10", "--upper", "5", "--input", good], "[10, 5) are empty or reversed"),
        (["--lower", "10", "--upper", "20", "--input", good, "--desc-id", "../x"], "description id '../x'"),
        (["--lower", "10", "--upper", "20", "--input", good, "--desc-id", ""], "description id ''"),
    ]
    if backend == "s3":
        cases = cases[:3]  # the rest is backend-independent validation
    results = cli.run_all(*[("append", shard_url, *args) for args, _ in cases])
    for (args, message), r in zip(cases, results, strict=True):
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert r.stderr.startswith("shardsink: error: "), r.stderr
        assert message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert cli.inspect(shard_url) == before
    assert part_objects(shard_url) == parts


def test_jsonl_and_parquet_inputs_with_and_without_diff_and_iso_bounds(
    local_cli: Cli, files: Files, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/formats"
    Shard.create(url, pa.schema([("k", pa.string()), ("v", pa.int64())]))
    (tmp_path / "nodiff.jsonl").write_text('{"k": "a", "v": 1, "_time": 3}\n{"k": "a", "v": 1, "_time": 4}\n')
    local_cli.ok("append", url, "--lower", "0", "--upper", "1970-01-01T00:00:00.010Z",
                 "--input", str(tmp_path / "nodiff.jsonl"))
    pq.write_table(pa.table({"k": ["a", "z"], "v": [1, 9], "_time": [10, 11], "_diff": [-2, 5]}),
                   tmp_path / "b.parquet")
    local_cli.ok("append", url, "--lower", "1970-01-01T00:00:00.010", "--upper", "20",
                 "--input", str(tmp_path / "b.parquet"))
    rows = [json.loads(line) for line in local_cli.ok("snapshot", url).splitlines()]
    assert rows == [{"k": "z", "v": 9, "_count": 5}]
    assert Shard.open(url).info().upper == 20


# --- inspect / log ---------------------------------------------------------------------------------


def test_inspect_json_reports_the_state_and_upper_null_after_close(cli: Cli, shard_url: str) -> None:
    filled_by_library(shard_url)
    from shardsink.sinks.description import Description
    from shardsink.sinks.staging import write_manifest

    ahead = Description("backfill-day-4", 30, 40, 1)  # a backfill's later day, staged ahead of the upper
    staged = Shard.open(shard_url).stage(pa.table({"k": ["a"], "v": [1], "_time": [30], "_diff": [1]}),
                                         lower=30, upper=40, desc_id=ahead.desc_id)
    write_manifest(Shard.open(shard_url), ahead, slot=0, slots=2, parts=staged.parts)
    d = cli.inspect(shard_url)
    assert d.keys() >= INSPECT_KEYS
    assert d["staged_waiting"] == [{"desc_id": "backfill-day-4", "lower": 30, "upper": 40, "staged_slots": 1,
                                    "slots": 2, "turn": "waiting"}]
    assert "1 descriptions staged at or ahead of the upper" in cli.ok("inspect", shard_url)
    assert (d["seqno"], d["upper"], d["since"], d["batches"], d["parts"], d["rows"]) == (2, 20, 0, 2, 2, 5)
    assert d["bytes"] > 0
    assert d["schema"] == [{"name": "k", "type": "string", "nullable": True},
                           {"name": "v", "type": "int64", "nullable": True}]
    Shard.open(shard_url).close(expected_upper=20, desc_id="the-end")
    (cli.cwd / "late.csv").write_text("k,v,_time\nz,1,25\n")
    human, closed, refused = cli.run_all(
        ("inspect", shard_url),
        ("inspect", shard_url, "--json"),
        ("append", shard_url, "--lower", "20", "--upper", "30", "--input", str(cli.cwd / "late.csv")),
    )
    assert human.returncode == 0 and "upper" in human.stdout and "seqno" in human.stdout
    assert "1 descriptions staged at or ahead of the upper" not in human.stdout  # closed: nothing waits
    d = json.loads(closed.stdout)
    assert (d["upper"], d["seqno"], d["closed"]) == (None, 3, True)
    assert refused.returncode == 2 and "closed" in refused.stderr


def test_log_json_lists_commits_newest_first_and_honours_limit(cli: Cli, shard_url: str) -> None:
    filled_by_library(shard_url)
    full, limited, human = cli.run_all(
        ("log", shard_url, "--json"), ("log", shard_url, "--json", "--limit", "1"), ("log", shard_url)
    )
    log = json.loads(full.stdout)
    assert all(e.keys() >= LOG_KEYS and e["at"] for e in log)
    assert [(e["seqno"], e["desc_id"], e["lower"], e["upper"], e["rows"], e["writer"]) for e in log[:2]] == [
        (2, "d2", 10, 20, 2, "dag-b"),
        (1, "d1", 0, 10, 3, "dag-a"),
    ]
    assert (log[2]["seqno"], log[2]["kind"], log[2]["upper"]) == (0, "create", 0) and "desc_id" not in log[2]
    assert len(log) == 3
    assert [e["seqno"] for e in json.loads(limited.stdout)] == [2]
    assert human.returncode == 0 and "dag-b" in human.stdout and "d2 [10, 20) 2 rows" in human.stdout


# --- reads ------------------------------------------------------------------------------------------


def test_snapshot_writes_jsonl_csv_and_parquet_with_a_count_column(local_cli: Cli, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/snap"
    filled_by_library(url)
    out = tmp_path / "out"
    out.mkdir()
    now = [{"k": "a", "v": 1, "_count": 1}, {"k": "b", "v": 2, "_count": 1}, {"k": "c", "v": 3, "_count": 1}]
    stdout, jsonl, csv_out, parquet, early, too_late, unwritable = local_cli.run_all(
        ("snapshot", url),
        ("snapshot", url, "--output", str(out / "s.jsonl")),
        ("snapshot", url, "--format", "csv", "--output", str(out / "s.csv")),
        ("snapshot", url, "--as-of", "9", "--output", str(out / "s.parquet")),
        ("snapshot", url, "--as-of", "4", "--format", "jsonl"),
        ("snapshot", url, "--as-of", "20"),
        ("snapshot", url, "--output", str(out / "no" / "such" / "dir.jsonl")),
    )
    assert [json.loads(line) for line in stdout.stdout.splitlines()] == now
    for r in (jsonl, csv_out, parquet):
        assert r.returncode == 0, f"{r.args}: exit {r.returncode}\n{r.stderr}"
    assert [json.loads(line) for line in (out / "s.jsonl").read_text().splitlines()] == now
    with open(out / "s.csv", newline="") as f:
        assert [(r["k"], int(r["v"]), int(r["_count"])) for r in csv.DictReader(f)] == [
            (r["k"], r["v"], r["_count"]) for r in now
        ]
    assert pq.read_table(out / "s.parquet").to_pylist() == [
        {"k": "a", "v": 1, "_count": 2}, {"k": "b", "v": 2, "_count": 1},
    ]
    assert [json.loads(line) for line in early.stdout.splitlines()] == [{"k": "a", "v": 1, "_count": 1}]
    assert too_late.returncode == 2 and "as_of 20 is not readable" in too_late.stderr
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr


def test_changes_lists_the_updates_in_from_to(cli: Cli, shard_url: str) -> None:
    filled_by_library(shard_url)
    middle, tail, beyond = cli.run_all(
        ("changes", shard_url, "--from", "5", "--to", "15"),
        ("changes", shard_url, "--from", "15", "--to", "20", "--format", "csv"),
        ("changes", shard_url, "--from", "0", "--to", "21"),
    )
    assert [json.loads(line) for line in middle.stdout.splitlines()] == [
        {"k": "a", "v": 1, "_time": 7, "_diff": 1}, {"k": "b", "v": 2, "_time": 5, "_diff": 1},
        {"k": "c", "v": 3, "_time": 12, "_diff": 1},
    ]
    assert tail.stdout.splitlines() == ['"k","v","_time","_diff"', '"a",1,15,-1']
    assert beyond.returncode == 2 and "beyond upper 20" in beyond.stderr


# --- URLs --------------------------------------------------------------------------------------------


def test_relative_path_url_is_a_folder_under_the_working_directory(local_cli: Cli, files: Files,
                                                                    tmp_path: Path) -> None:
    local_cli.ok("create", "shards/events", "--schema-from", str(files.schema_csv), cwd=tmp_path)
    local_cli.ok("append", "shards/events", "--lower", "0", "--upper", "10", "--input", str(files.batch1),
                 cwd=tmp_path)
    assert (tmp_path / "shards" / "events" / "state").is_dir()
    info = Shard.open(f"file://{tmp_path}/shards/events").info()
    assert (info.url, info.upper, info.stats.rows) == (f"file://{tmp_path}/shards/events", 10, 3)


def test_url_with_dotdot_exits_2_and_creates_nothing(local_cli: Cli, files: Files, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    urls = ["../escape", "shards/../escape", f"file://{tmp_path}/a/../escape", "s3://shardsink-test/a/../b"]
    calls = [("create", url, "--schema-from", str(files.schema_csv)) for url in urls]
    results = [local_cli.run(*c, cwd=work) for c in calls[:1]] + local_cli.run_all(*calls[1:], ("inspect", urls[0]))
    for r in results:
        assert r.returncode == 2 and "'..'" in r.stderr, r.stderr
    assert not (tmp_path / "escape").exists() and list(work.iterdir()) == []


def test_nonexistent_shard_exits_2_for_every_command(cli: Cli, backend: str, files: Files, shard_url: str) -> None:
    commands = [["inspect"], ["append", "--lower", "0", "--upper", "10", "--input", str(files.batch1)], ["log"],
                ["snapshot"], ["changes", "--from", "0", "--to", "1"]]
    if backend == "s3":
        commands = commands[:2]
    results = cli.run_all(*[(c[0], shard_url, *c[1:]) for c in commands])
    for c, r in zip(commands, results, strict=True):
        assert r.returncode == 2, (c, r.stderr)
        assert f"no shard at {shard_url}" in r.stderr
    assert part_objects(shard_url) == []


def test_inspect_objects_calls_leaked_only_unreferenced_parts_older_than_the_grace(local_cli: Cli, files: Files,
                                                                                   tmp_path: Path) -> None:
    url = str(tmp_path / "leaky")
    local_cli.ok("create", url, "--schema-from", str(files.schema_csv))
    local_cli.ok("append", url, "--lower", "0", "--upper", "10", "--input", str(files.batch1))
    committed = next((tmp_path / "leaky" / "parts").rglob("*.parquet"))
    orphan = tmp_path / "leaky" / "parts" / "dead-writer" / "orphan.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(committed.read_bytes())
    old = orphan.stat().st_mtime - 7200
    os.utime(orphan, (old, old))
    fresh = orphan.with_name("in-flight.parquet")
    fresh.write_bytes(b"x")

    got = json.loads(local_cli.ok("inspect", url, "--json", "--objects"))["objects"]
    assert [(x["cls"], x["key"]) for x in got["objects"]] == [
        ("in_flight", "parts/dead-writer/in-flight.parquet"),  # younger than the grace period
        ("leaked", "parts/dead-writer/orphan.parquet")]  # the upper (10) passed its lower: it can never commit
    assert (got["counts"]["live"]["count"], got["counts"]["leaked"]["count"]) == (1, 1)
    everything = json.loads(local_cli.ok("inspect", url, "--json", "--leaks", "--grace", "0"))["objects"]
    assert sorted(x["key"] for x in everything["objects"] if x["cls"] == "leaked") == [
        "parts/dead-writer/in-flight.parquet", "parts/dead-writer/orphan.parquet"]
    assert "0 awaiting GC (0 bytes), 1 in flight" in local_cli.ok("inspect", url, "--objects")
    assert "objects" not in local_cli.inspect(url)


def test_a_command_starts_without_pandas_and_an_airflow_process_finds_it_imported() -> None:
    """pyarrow imports pandas to convert Python values; the library never imports it at import time
    (0.4 CPU-s of each command's start: ``shardsink inspect`` took 0.57 CPU-s against 1.09), and the
    provider module, which every Airflow process imports, does (shardsink.provider: forked tasks
    use it)."""
    probe = ("import sys, shardsink.cli; cli = 'pandas' in sys.modules\n"
             "import shardsink.provider; print(cli, 'pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False", "True"], r.stdout
