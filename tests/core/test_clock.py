"""The wall clock a commit is stamped with is core's one public hook (:data:`shardsink.core.clock.WALL`):
a caller installs its own clock for a block (the simulator's simulated time) and gets the real one back
after, also when the block raises."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from shardsink import Shard
from shardsink.core.clock import WALL


def test_a_commit_is_stamped_by_the_installed_clock_and_the_wall_clock_comes_back(tmp_path: Path) -> None:
    with WALL.using(lambda: 1_800_000_000.25):
        shard = Shard.create(f"file://{tmp_path}/s", pa.schema([("k", pa.string())]))
        assert WALL.iso() == "2027-01-15T08:00:00.250+00:00"
    assert shard.reader().head().commit.at == "2027-01-15T08:00:00.250+00:00"
    with pytest.raises(RuntimeError), WALL.using(lambda: 0.0):
        raise RuntimeError("the block fails")
    assert abs(WALL.now() - time.time()) < 5.0
