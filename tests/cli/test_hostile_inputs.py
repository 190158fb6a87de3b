"""Hostile values at every entry point are refused naming the value and the allowed range; nothing is written.

Issue 17 items 1 (times beyond int64), 5 (writer names), 6 (NaN and infinite durations) and
7 (wrong argument types), on both backends: each refusal is exit 2 (InvalidUsageError), its
message names the offending value, and every object of the shard is byte-identical afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import Shard
from shardsink.cli import main
from shardsink.core import leases
from shardsink.core.checks import TIME_MAX
from shardsink.errors import InvalidUsageError
from shardsink.maintenance import compaction_pass, set_retention
from shardsink.maintenance.census_read import take_census
from shardsink.maintenance.gc_types import GcOptions
from shardsink.storage import Blob

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.float64())])


def _rows(t: int) -> pa.Table:
    return pa.table({"k": ["a", "b"], "v": [1.0, 2.0], "_time": [t, t]})


def objects(blob: Blob) -> dict[str, bytes]:
    """Every object of the shard with its bytes (the lock folder of the local backend excluded)."""
    out = {}
    for o in blob.list(""):
        got = blob.get(o.key)
        assert got is not None
        out[o.key] = got.data
    return out


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in-process: (exit code, stderr); argparse usage errors exit via SystemExit."""
    try:
        code = main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture
def made(shard_url: str, blob: Blob, tmp_path: Path) -> tuple[Shard, Path]:
    shard = Shard.create(shard_url, SCHEMA, blob=blob)
    shard.append(_rows(5), lower=0, upper=10, desc_id="d0")
    data = tmp_path / "in.parquet"
    pq.write_table(_rows(10), data)
    return shard, data


BIG = str(2**63)
CLI_CASES = [
    pytest.param(["append", "{url}", "--lower", "10", "--upper", BIG, "--input", "{file}"], BIG,
                 id="append-upper-2^63"),
    pytest.param(["append", "{url}", "--lower", "-1", "--upper", "20", "--input", "{file}"], "-1",
                 id="append-lower-neg"),
    pytest.param(["changes", "{url}", "--from", "0", "--to", BIG], BIG, id="changes-to-2^63"),
    pytest.param(["snapshot", "{url}", "--as-of", str(2**64)], str(2**64), id="snapshot-as-of-2^64"),
    pytest.param(["append", "{url}", "--lower", "10", "--upper", "20", "--input", "{file}", "--writer", "w" * 2000],
                 "2000 characters", id="writer-too-long"),
    pytest.param(["append", "{url}", "--lower", "10", "--upper", "20", "--input", "{file}", "--writer",
                  "evil\x1b[31mred"], "non-printable", id="writer-ansi-escape"),
    pytest.param(["append", "{url}", "--lower", "10", "--upper", "20", "--input", "{file}", "--writer", ""],
                 "0 characters", id="writer-empty"),
    pytest.param(["gc", "{url}", "--grace", "nan"], "nan", id="gc-grace-nan"),
    pytest.param(["gc", "{url}", "--grace", "inf"], "inf", id="gc-grace-inf"),
    pytest.param(["gc", "{url}", "--grace=-1s"], "-1s", id="gc-grace-negative"),
    pytest.param(["inspect", "{url}", "--leaks", "--grace", "nan"], "nan", id="inspect-grace-nan"),
    pytest.param(["log", "{url}", "--limit", "0"], "at least 1", id="log-limit-0"),
    pytest.param(["log", "{url}", "--limit", str(2**40)], str(2**40), id="log-limit-huge"),
    pytest.param(["retention", "{url}", "--set", f"{2**63}ms"], str(2**63), id="retention-past-int64"),
]


@pytest.mark.parametrize(("args", "named"), CLI_CASES)
def test_cli_refuses_out_of_range_values_with_exit_2_and_writes_nothing(
        made: tuple[Shard, Path], blob: Blob, capsys: pytest.CaptureFixture[str], args: list[str], named: str) -> None:
    shard, data = made
    before = objects(blob)
    code, err = cli([a.format(url=shard.url, file=data) for a in args], capsys)
    assert code == 2, err
    assert named in err and "Traceback" not in err, err
    assert objects(blob) == before


def test_cli_create_past_int64_creates_nothing(shard_url: str, blob: Blob, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    schema_file = tmp_path / "s.parquet"
    pq.write_table(_rows(0), schema_file)
    code, err = cli(["create", shard_url, "--schema-from", str(schema_file), "--upper", str(2**64)], capsys)
    assert code == 2 and str(2**64) in err and str(TIME_MAX) in err, err
    assert objects(blob) == {}


def test_a_shard_at_the_largest_time_still_compacts_and_reads(made: tuple[Shard, Path], blob: Blob) -> None:
    """The top of the range works end to end: upper = 2**63 - 1, retention pushing since right
    up to it, compaction (which used to die with OverflowError past int64) and reads."""
    shard, _ = made
    shard.append(_rows(TIME_MAX - 1), lower=10, upper=TIME_MAX, desc_id="top")
    set_retention(shard, 1)
    done = compaction_pass(shard)
    assert shard.info().since == TIME_MAX - 1
    assert done.compaction is not None and done.compaction.merges
    assert all(m.status == "applied" for m in done.compaction.merges)
    assert not [o.key for o in blob.list("staging/")]  # no leaked compaction manifest
    assert shard.snapshot().num_rows == 2
    assert shard.changes(TIME_MAX - 1, TIME_MAX).num_rows == 2
    with pytest.raises(InvalidUsageError, match=str(2**63)):
        shard.append(_rows(TIME_MAX), lower=TIME_MAX, upper=2**63, desc_id="past")


def _refused(call: Callable[[], Any], named: str) -> None:
    with pytest.raises(InvalidUsageError, match=named) as e:
        call()
    assert e.value.exit_code == 2


def test_python_api_refuses_out_of_range_and_wrong_types_and_writes_nothing(
        made: tuple[Shard, Path], blob: Blob, shard_url: str) -> None:
    shard, _ = made
    before = objects(blob)
    nan = math.nan
    _refused(lambda: shard.append(_rows(10), lower=10, upper=2**63), str(2**63))
    _refused(lambda: shard.append(_rows(10), lower=10, upper=20, writer="x" * 1025), "1025 characters")
    _refused(lambda: shard.append(_rows(10), lower=10, upper=20, writer="a\nb"), "non-printable")
    _refused(lambda: shard.append([1, 2], lower=10, upper=20), "got list")  # type: ignore[arg-type]
    _refused(lambda: shard.append({"k": ["a"], "v": [1.0]}, lower=10, upper=20), "_time")  # no time column
    _refused(lambda: shard.append(_rows(10), lower=10, upper=20, desc_id=7), "not a string")  # type: ignore[arg-type]
    _refused(lambda: shard.compare_and_append(["x"], expected_upper=10, new_upper=20,  # type: ignore[list-item]
                                              desc_id="d"), "StagedBatch")
    _refused(lambda: shard.compare_and_append([], expected_upper=10, new_upper=20, desc_id="d",
                                              props={"a": 1}), "strings")  # type: ignore[dict-item]
    _refused(lambda: shard.snapshot(2**63), str(2**63))
    _refused(lambda: shard.snapshot("5"), "not an integer")  # type: ignore[arg-type]
    _refused(lambda: shard.changes(0, 2**63), str(2**63))
    _refused(lambda: take_census(shard, grace_s=nan), "nan")
    _refused(lambda: shard.log(limit=True), "not an integer")  # type: ignore[arg-type]
    _refused(lambda: GcOptions(grace_s=nan), "nan")
    _refused(lambda: GcOptions(grace_s=math.inf), "inf")
    _refused(lambda: leases.acquire(shard, 5, holder="h", ttl_s=nan), "nan")
    _refused(lambda: leases.acquire(shard, 2**63, holder="h"), str(2**63))
    _refused(lambda: set_retention(shard, 2**63), str(2**63))
    _refused(lambda: Shard.open(42), "not a string")  # type: ignore[arg-type]
    assert objects(blob) == before
    _refused(lambda: Shard.create(shard_url + "-x", SCHEMA, upper=2**64), str(2**64))
    _refused(lambda: Shard.create(shard_url + "-x", {"k": "string"}), "pyarrow.Schema")  # type: ignore[arg-type]
    _refused(lambda: Shard.create(shard_url + "-x", SCHEMA, writer="\x1b]0;x"), "non-printable")
    assert objects(blob) == before


def test_append_accepts_a_mapping_of_columns(made: tuple[Shard, Path]) -> None:
    shard, _ = made
    r = shard.append({"k": ["c"], "v": [3.0], "_time": [12]}, lower=10, upper=20, desc_id="mapping")
    assert r.status == "committed" and r.rows == 1
    assert sorted(shard.snapshot()["k"].to_pylist()) == ["a", "b", "c"]


@pytest.mark.parametrize(("change", "named"), [
    ({"max_span": 0}, "max_span 0"), ({"max_span": 2**63}, str(2**63)), ({"writers": 0}, "writers 0"),
    ({"initial_upper": -5}, "-5"), ({"poke_interval": math.nan}, "nan"), ({"catch_up_after": -1.0}, "-1.0"),
    ({"backoff_cap": math.inf}, "inf"), ({"max_chain": 0}, "max_chain 0"),
])
def test_dag_settings_are_range_checked_when_the_dag_file_is_parsed(change: dict[str, Any], named: str) -> None:
    from shardsink.airflow.settings import IngestSettings

    good = {"dag_id": "d", "shard_url": "file:///tmp/x", "source_spec": {}, "writers": 2, "max_span": 3_600_000,
            "max_attempts": 3, "initial_upper": 0}
    IngestSettings(**good)
    _refused(lambda: IngestSettings(**{**good, **change}), named)
