"""Synthetic landing-zone data for the demo, tests and benchmarks.

Writes files in all three formats with an ``event_time`` column, plus the watermark
object, following docs/landing-zone.md. Deterministic for a given seed.
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from shardsink.sources.landing import WATERMARK_KEY
from shardsink.storage.url import open_blob

DAY = 86_400_000
SCHEMA = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])
_USERS = [f"u{i:03d}" for i in range(50)]
_ACTIONS = ["view", "click", "buy"]


def landing_table(start: int, end: int, rows: int, *, seed: int) -> pa.Table:
    """``rows`` random events with ``event_time`` in ``[start, end)``."""
    rnd = random.Random(seed)
    return pa.table({
        "user": [rnd.choice(_USERS) for _ in range(rows)],
        "action": [rnd.choice(_ACTIONS) for _ in range(rows)],
        "amount": [rnd.randrange(1, 100) for _ in range(rows)],
        "event_time": [rnd.randrange(start, end) for _ in range(rows)],
    })


def encode(table: pa.Table, fmt: str) -> bytes:
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()
    if fmt == "csv":
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        return bytes(sink.getvalue().to_pybytes())
    return "".join(json.dumps(r) + "\n" for r in table.to_pylist()).encode()


def land_file(root: str, key: str, table: pa.Table) -> None:
    """Write one landing file (format from the key's suffix)."""
    open_blob(root).put(key, encode(table, key.rsplit(".", 1)[-1]))


def publish_watermark(root: str, watermark: int) -> None:
    open_blob(root).put(WATERMARK_KEY, json.dumps({"watermark": watermark}).encode())


def generate(root: str, *, start: int, days: int, files_per_day: int = 3, rows_per_file: int = 200,
             seed: int = 7, watermark: int | None = None) -> Counter[int]:
    """Land ``days`` days of events from ``start``; return rows per day index.

    Files rotate through Parquet, CSV and JSONL. The watermark defaults to the end of
    the last day.
    """
    per_day: Counter[int] = Counter()
    fmts = ["parquet", "csv", "jsonl"]
    for d in range(days):
        for i in range(files_per_day):
            fmt = fmts[(d * files_per_day + i) % 3]
            t = landing_table(start + d * DAY, start + (d + 1) * DAY, rows_per_file, seed=seed * 1000 + d * 31 + i)
            land_file(root, f"day={d:03d}/events-{i}.{fmt}", t)
            per_day[d] += t.num_rows
    publish_watermark(root, start + days * DAY if watermark is None else watermark)
    return per_day
