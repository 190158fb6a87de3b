"""A declared day-folder layout (shardsink.sources.landing.partitions): hostile spec values are
refused naming them, a run lists only its window's and lateness horizon's folders (one LIST
each, whatever the history), files outside day folders are not data, a file holding another
day's times is refused, and docs/landing-zone.md's python blocks run as written."""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runbook_layout import blocks
from test_readme import _RUNNER, _env, _expected_prints

from shardsink.errors import InvalidUsageError
from shardsink.sources import LandingSource, MalformedInputError, source_from_spec
from shardsink.sources.landing.partitions import DAY_MS, check_in_day
from shardsink_dev.synthetic import land_file, landing_table

REPO = Path(__file__).resolve().parents[2]
NOV_20 = 1_795_132_800_000  # 2026-11-20T00:00:00Z


@pytest.mark.parametrize(("partitions", "lateness", "names"), [
    ("dt=YYYY-MM-DD/", None, "dt=YYYY-MM-DD/"),
    ("hourly", "1d", "hourly"),
    ("x" * 10_000, None, "xxxx"),
    ("YYYY/MM/DD", "2 days", "2 days"),
    ("YYYY/MM/DD", "-1d", "-1d"),
    ("YYYY/MM/DD", "1e3d", "1e3d"),
    ("YYYY/MM/DD", "3661d", "3661d"),
    ("YYYY/MM/DD", "9" * 40 + "w", "9999"),
    ("YYYY/MM/DD", "\uff12d", "\uff12d"),  # a full-width digit is not a duration
    (None, "2d" * 5000, "2d2d"),
    (None, "2d", "2d"),
])
def test_a_bad_layout_or_lateness_is_refused_naming_the_value(tmp_path: Path, partitions: Any, lateness: Any,
                                                              names: str) -> None:
    with pytest.raises(InvalidUsageError, match=re.escape(names)):
        LandingSource(str(tmp_path), partitions=partitions, lateness=lateness)
    spec = {"kind": "landing", "root": str(tmp_path), "partitions": partitions, "lateness": lateness}
    with pytest.raises(InvalidUsageError):
        source_from_spec(spec)


def test_the_layout_travels_in_the_spec(tmp_path: Path) -> None:
    src = LandingSource(str(tmp_path), partitions="YYYY/MM/DD", lateness="36h")
    again = source_from_spec(json.loads(json.dumps(src.spec())))
    assert isinstance(again, LandingSource)
    assert (again.partitions, again.lateness_ms) == ("YYYY/MM/DD", 36 * 3_600_000)
    assert "partitions" not in LandingSource(str(tmp_path)).spec(), "a flat zone's spec is unchanged"
    assert LandingSource(str(tmp_path), partitions="YYYY/MM/DD").lateness_ms == DAY_MS


class _Counting:
    """A blob that counts its LIST calls (by prefix)."""

    def __init__(self, blob: Any) -> None:
        self.blob = blob
        self.lists: list[str] = []

    def list(self, prefix: str) -> Iterator[Any]:
        self.lists.append(prefix)
        return self.blob.list(prefix)


@pytest.mark.parametrize("layout", ["dt=YYYY-MM-DD", "YYYY/MM/DD"])
def test_a_run_lists_only_its_days_and_the_lateness_horizon(tmp_path: Path, layout: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "landing")
    for d in range(40):
        day = NOV_20 - 30 * DAY_MS + d * DAY_MS
        ymd = dt.datetime.fromtimestamp(day / 1000, dt.UTC).date()
        folder = f"dt={ymd.isoformat()}" if layout == "dt=YYYY-MM-DD" else ymd.strftime("%Y/%m/%d")
        land_file(root, f"{folder}/a.parquet", landing_table(day, day + DAY_MS, 3, seed=d))
    land_file(root, "stray.parquet", landing_table(NOV_20, NOV_20 + DAY_MS, 3, seed=1))  # outside every folder
    land_file(root, "dt=2026-02-30/b.parquet", landing_table(NOV_20, NOV_20 + DAY_MS, 3, seed=1))  # no such day
    src = LandingSource(root, partitions=layout, lateness="2d")
    counting = _Counting(src.blob())
    monkeypatch.setattr(src, "blob", lambda: counting)
    got = src.files(window=(NOV_20, NOV_20 + DAY_MS))
    assert len(got) == 3 and len(counting.lists) == 3, (got, counting.lists)
    assert all(p.endswith("/") and p.strip("/") for p in counting.lists), "day folders, never the whole zone"
    # The same window with 30 more days of history lists the same: nothing grows with history.
    wide = src.files(window=(NOV_20 - 80 * DAY_MS, NOV_20 + DAY_MS))  # > 62 days: one listing of the zone
    assert counting.lists[-1] == "" and len(wide) == 31
    assert len(src.files()) == 40, "without a window: every day folder, the stray and the non-day left out"


def test_a_file_holding_another_days_times_is_refused(tmp_path: Path) -> None:
    check_in_day("dt=YYYY-MM-DD", "dt=2026-11-20/a.parquet", NOV_20, NOV_20 + DAY_MS - 1, root="r")
    with pytest.raises(MalformedInputError, match=r"r/dt=2026-11-20/a\.parquet holds event times .* outside its day"):
        check_in_day("dt=YYYY-MM-DD", "dt=2026-11-20/a.parquet", NOV_20, NOV_20 + DAY_MS, root="r")
    with pytest.raises(MalformedInputError, match="outside its day folder 2026-11-20"):
        check_in_day("YYYY/MM/DD", "2026/11/20/x/a.csv", NOV_20 - 1, NOV_20, root="r")


def test_the_landing_zone_page_python_blocks_run_as_written(tmp_path: Path) -> None:
    page = REPO / "docs" / "landing-zone.md"
    todo = [b for b in blocks(page) if b.lang == "python"]
    assert todo and all(b.lang in ("python", "text", "") for b in blocks(page))
    got = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps([(f"landing-zone.md:{b.line}", b.text)
                                                                            for b in todo]),
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-4000:]
    for b, out in zip(todo, json.loads(got.stdout.splitlines()[-1]), strict=True):
        want = _expected_prints(b.text)
        assert len(out.splitlines()) == len(want)
        for line, value in zip(out.splitlines(), want, strict=True):
            assert value is None or ast.literal_eval(line) == value, (b.line, line)
