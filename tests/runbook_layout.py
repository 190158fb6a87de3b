"""What tests/test_runbooks.py runs the runbooks against, and how it reads them.

:func:`blocks` reads a page's fenced code blocks, each with its stack: a block right after
``<!-- stack: demo -->`` or ``<!-- stack: compose -->`` belongs to that stack only, any other
to both. :func:`build_demo` lays out what ``make run`` leaves in a checkout (``.demo/`` and
``.airflow/demo-logs/``) with the library and synthetic data, no Spark: an ingest shard whose
first two days two runs committed, a landing zone whose watermark is stuck at the third day
(its files landed), a writer of the newest run that staged a part and a manifest and died a
moment ago (its description may still commit) beside a Spark job's ``_temporary/`` file, an
older dead writer's part that can never commit, and a reclocked ``example_arrivals`` shard
with its remap shard and one binding.
"""

from __future__ import annotations

import os
import re
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardsink import Shard
from shardsink.sinks.description import Description, make_desc_id
from shardsink.sinks.ingest import mint_chain, open_or_create
from shardsink.sinks.staging import write_manifest
from shardsink.sources.files import FileArrivals
from shardsink.sources.landing import LandingSource, read_landing_file
from shardsink_dev import dagrunner
from shardsink_dev.synthetic import DAY, generate, land_file, landing_table

REPO = Path(__file__).resolve().parents[1]
RUNBOOKS = REPO / "docs" / "runbooks"
DAG = "example_ingest"
START = 1_704_067_200_000  # 2024-01-01T00:00:00Z
STUCK = START + 2 * DAY  # the watermark: the third day's files landed, it was never published past them


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    stack: str  # "demo", "compose" or "both"
    text: str


_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_STACK = re.compile(r"^\s*<!-- stack: (demo|compose) -->\s*$")


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` (a fence without a language is ``lang=""``)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        stack = _STACK.match(prev)
        j = i + 1
        while j < len(lines) and not _FENCE.match(lines[j]):
            j += 1
        body = "\n".join(ln[indent:] if ln[:indent].isspace() else ln for ln in lines[i + 1:j])
        out.append(Block(path.name, i + 1, lang, stack.group(1) if stack else "both", body))
        i = j + 1
    return out


def pages() -> list[Path]:
    """The runbook pages; drop-shard.md last (it deletes the shard it runs on)."""
    return sorted(RUNBOOKS.glob("*.md"), key=lambda p: (p.name == "drop-shard.md", p.name))


def setup_block(stack: str) -> Block:
    return next(b for b in blocks(RUNBOOKS / "README.md") if b.stack == stack and "af()" in b.text)


# --- the demo layout ------------------------------------------------------------------------


def _landing_rows(src: LandingSource, schema: pa.Schema, day: int) -> pa.Table:
    files = [f for f in src.files() if f.key.startswith(f"day={day:03d}/")]
    return pa.concat_tables(read_landing_file(src.blob(), f, schema, "event_time") for f in files)


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (t, t))


def build_shards(demo: Path, runs: list[str]) -> str:
    """The ingest shard (days 1 and 2 committed by ``runs``), its landing zone and the arrivals
    shard; returns the ingest shard's URL."""
    landing = demo / "landing"
    generate(str(landing), start=START, days=3, files_per_day=2, rows_per_file=40, watermark=STUCK)
    src = LandingSource(str(landing), time_column="event_time")
    url = (demo / "shards" / "events").as_uri()
    shard = open_or_create(url, src, initial_upper=START)
    for d, run in enumerate(runs):
        shard.append(_landing_rows(src, shard.schema, d), lower=START + d * DAY, upper=START + (d + 1) * DAY,
                     desc_id=make_desc_id(DAG, run, 1), writer=f"airflow:{DAG}/{run}")
    dead = make_desc_id(DAG, runs[0], 2)  # a first try that lost and whose cleanup never ran
    shard.stage(_landing_rows(src, shard.schema, 0), lower=START, upper=START + DAY, desc_id=dead)
    _age(demo / "shards" / "events" / "parts" / dead, 7200)
    arrivals = demo / "arrivals"
    for i in range(2):
        land_file(str(arrivals), f"day=000/{'ab'[i]}.parquet", landing_table(START, START + DAY, 20, seed=i))
    _age(arrivals, 600)
    data = str(demo / "shards" / "arrivals")
    source = FileArrivals(str(arrivals), remap=data + "-remap", settle_seconds=30)
    minted = mint_chain(open_or_create(data, source, initial_upper=START), source, interval_end=START + DAY,
                        max_span=None, max_chain=1, dag_id="example_arrivals", run_id="manual__arrivals", attempt=1)
    assert isinstance(minted, list), minted
    return url


def crash_a_writer(url: str, run: str) -> str:
    """Run ``run``'s writer of the third day: slot 0 staged a part and its manifest, slot 1's
    Spark job is writing a ``_temporary/`` file; then both died. Returns the description id."""
    shard = Shard.open(url)
    src = LandingSource(str(Path(url.removeprefix("file://")).parents[1] / "landing"), time_column="event_time")
    d = Description(make_desc_id(DAG, run, 1), STUCK, STUCK + DAY, 1)
    staged = shard.stage(_landing_rows(src, shard.schema, 2), lower=d.lower, upper=d.upper, desc_id=d.desc_id)
    write_manifest(shard, d, slot=0, slots=2, parts=staged.parts)
    shard._machine.blob.put(f"parts/{d.desc_id}/spark-5d1e/_temporary/0/_temporary/attempt_202601010000_0001_m_000000_0/"
                   "part-00000-5d1e.snappy.parquet", b"PAR1 (half written)")
    return d.desc_id


# --- the Airflow CLI behind the `airflow` stand-in ---------------------------------------------

#: Commands that start, queue or clear runs: only parsed (the test runs one `dags test` itself).
_PARSE_ONLY = (("dags", "test"), ("dags", "trigger"), ("dags", "clear"), ("tasks", "clear"), ("tasks", "test"),
               ("dags", "delete"), ("backfill", "create"))


def parse_only(argv: list[str]) -> bool:
    return tuple(argv[:2]) in _PARSE_ONLY and not (argv[:2] == ["backfill", "create"] and "--dry-run" in argv)


class AirflowServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves the ``airflow`` stand-in (:mod:`runbook_shims`) from one warm Airflow CLI process."""

    daemon_threads = True

    def __init__(self, path: str, env: dict[str, str]) -> None:
        self.env = env
        self.lock = threading.Lock()
        self.calls: list[tuple[list[str], bool, int]] = []
        super().__init__(path, _Handler)

    def airflow(self, argv: list[str], *, parse: bool = False, split: bool = True) -> Any:
        """``airflow ARGV`` in the warm process (``parse``: only parsed; ``split``: stderr apart)."""
        with self.lock:
            got = dagrunner.airflow(self.env, argv, timeout=600, parse_only=parse, split=split)
            self.calls.append((argv, parse, got.returncode))
            return got


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        import json

        assert isinstance(self.server, AirflowServer)
        argv = json.loads(self.rfile.readline())["argv"]
        got = self.server.airflow(argv, parse=parse_only(argv))
        self.wfile.write(json.dumps({"rc": got.returncode, "out": got.stdout, "err": got.stderr}).encode())


def serve(path: str, env: dict[str, str]) -> Iterator[AirflowServer]:
    server = AirflowServer(path, env)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        dagrunner.close_all()


def shim(path: Path, tool: str) -> None:
    """An executable ``tool`` at ``path`` that runs :mod:`runbook_shims` with this Python."""
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
                    f"import runbook_shims\nsys.exit(runbook_shims.{tool}_main(sys.argv[1:]))\n")
    path.chmod(0o755)


def wrapper(path: Path, target: str) -> None:
    path.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    path.chmod(0o755)
