"""The Iceberg tests assert the view right after each commit: they run its upkeep inline, in the
committing call (tests/iceberg/test_background.py switches to the background worker itself)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardsink.iceberg import UPKEEP


@pytest.fixture(autouse=True)
def inline_upkeep() -> Iterator[None]:
    with UPKEEP.using(mode="inline"):
        yield
