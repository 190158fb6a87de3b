"""A source with a settable watermark and the synthetic landing schema, and rows for it: what
the sink tests mint and stage against without a landing zone."""

from __future__ import annotations

import pyarrow as pa

from shardsink_dev.synthetic import SCHEMA


class FakeSource:
    kind = "fake"

    def __init__(self, wm: int | None) -> None:
        self.wm = wm

    def spec(self) -> dict[str, object]:
        return {"kind": "fake"}

    def watermark(self) -> int | None:
        return self.wm

    def schema(self) -> pa.Schema:
        return SCHEMA


def rows(lo: int, n: int) -> pa.Table:
    """``n`` landing rows at times ``lo, lo + 1, ...``."""
    return pa.table({"user": [f"u{lo + i}" for i in range(n)], "action": ["x"] * n, "amount": list(range(n)),
                     "_time": [lo + i for i in range(n)]})
