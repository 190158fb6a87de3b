"""The README's main command (``make run``): shardsink end to end on a local folder.

Creates a shard under ``.demo/``, appends three daily batches, shows a lost race and
an idempotent retry, then inspects and reads the shard through the real CLI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from shardsink import Shard, UpperMismatchError

DAY = 86_400_000


def _cli(*args: str) -> None:
    print(f"\n$ shardsink {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "shardsink", *args], check=True)


def _day(day: int, users: list[str]) -> pa.Table:
    return pa.table({
        "user": users,
        "action": ["click"] * len(users),
        "_time": [day * DAY + i * 1000 for i in range(len(users))],
    })


def main() -> None:
    root = Path(".demo").resolve()
    shutil.rmtree(root / "events", ignore_errors=True)
    url = (root / "events").as_uri()
    schema = pa.schema([("user", pa.string()), ("action", pa.string())])
    shard = Shard.create(url, schema, upper=0)
    print(f"created {url}")
    for day, users in enumerate([["ann", "bob"], ["ann", "cid", "cid"], ["bob"]]):
        r = shard.append(_day(day, users), lower=day * DAY, upper=(day + 1) * DAY, desc_id=f"day-{day}")
        print(f"day {day}: {r.status} [{r.lower}, {r.upper}) at seqno {r.seqno}, {r.rows} rows")
    r = shard.append(_day(2, ["bob"]), lower=2 * DAY, upper=3 * DAY, desc_id="day-2")
    print(f"retry of day-2 after a lost acknowledgement: {r.status} (nothing duplicated)")
    try:
        shard.append(_day(1, ["eve"]), lower=DAY, upper=2 * DAY, desc_id="late-writer")
    except UpperMismatchError as e:
        print(f"a racing writer with a stale description loses: current upper {e.current}; its parts were deleted")
    _cli("inspect", url)
    _cli("log", url, "--limit", "5")
    _cli("snapshot", url)
    _cli("changes", url, "--from", str(DAY), "--to", str(2 * DAY))


if __name__ == "__main__":
    main()
