"""Each fact read once (issue 18, step 6), per task of one view run on the local backend: each
shard's head at most once per task, and each description's fate decided at most once.

The run is the materialize sink's steps as its Airflow tasks make them, each on fresh handles:
mint (``input_frontiers`` then ``mint_view(frontiers=...)``, as ``mint_view_task``), write (the
operator's ``ViewWriteOperator.committed_already`` and its typed request, then the job's library
call ``write_view(..., decided_at=...)`` on a shared session), append (``append_chain``).

Head reads are counted with the store's public request counter, per shard (through a
pass-through spy on the store factory the shard handle uses): every head read starts with one
GET of ``state/LATEST.json`` (its listing of ``state/v/`` is the same read's fallback when the
hint is missing, e.g. before the output shard exists, and is not counted again). A leased
Spark read also reads the head for the lease protocol
(:mod:`shardsink.core.leases`: the ``since`` re-check after the lease is written, whose version
the read then takes its parts from, which GC safety requires; the check before writing uses the
task's own version): that one read per lease is counted apart (the reads made inside
``leases.acquire_pinned``) and is not a fact. Fate decisions:
a pass-through spy on :func:`shardsink.core.fate.decide`, the one rule every fate goes through.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardsink.airflow.view import ViewWriteOperator
from shardsink.core import leases as ls
from shardsink.core import shard as core_shard
from shardsink.core.shard import Shard
from shardsink.sinks.append import append_chain
from shardsink.sinks.description import Description, to_builtins
from shardsink.sinks.materialize import View, input_frontiers, mint_view, view
from shardsink.spark.request import ViewWriteRequest, decode_request
from shardsink.spark.view import write_view
from shardsink.storage import retry
from shardsink.storage.url import parse_url

SCHEMA = pa.schema([("user", pa.string()), ("action", pa.string()), ("amount", pa.int64())])
AGGREGATE = "SELECT user, count(*) AS events, sum(amount) AS total FROM events GROUP BY user"
ROW_WISE = "SELECT user, amount FROM events WHERE amount > 1"


def _events(rows: list[tuple[str, str, int, int]]) -> pa.Table:
    user, action, amount, time = (list(c) for c in zip(*rows, strict=True))
    return pa.table({"user": user, "action": action, "amount": amount, "_time": time, "_diff": [1] * len(rows)},
                    schema=pa.schema([*SCHEMA, ("_time", pa.int64()), ("_diff", pa.int64())]))


class Reads:
    """Head reads per shard URL: ``facts`` (what a task decides from) and ``lease`` (the lease
    protocol's own, see the module docstring)."""

    def __init__(self) -> None:
        self.facts: Counter[str] = Counter()
        self.lease: Counter[str] = Counter()
        self.roots: dict[int, tuple[retry.RequestCounter, str]] = {}
        self.local = threading.local()

    def clear(self) -> None:
        self.facts.clear()
        self.lease.clear()

    def of(self, url: str) -> int:
        return self.facts[str(parse_url(url))]

    def leased(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, with the head reads it makes counted as the lease protocol's."""

        def inside(*args: Any, **kwargs: Any) -> Any:
            self.local.depth = getattr(self.local, "depth", 0) + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.local.depth -= 1

        return inside


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    seen = Reads()
    real_open, real_count = core_shard.open_blob, retry.RequestCounter.count

    def open_blob(url: str, *args: Any, **kwargs: Any) -> Any:
        blob = real_open(url, *args, **kwargs)
        counter = blob.counter
        seen.roots[id(counter)] = (counter, str(parse_url(url)))  # keeps the counter alive: ids stay unique
        return blob

    def count(self: retry.RequestCounter, method: str, key: str) -> None:
        root = seen.roots.get(id(self))
        if root is not None and (method, key) == ("get", "state/LATEST.json"):
            (seen.lease if getattr(seen.local, "depth", 0) else seen.facts)[root[1]] += 1
        real_count(self, method, key)

    monkeypatch.setattr(core_shard, "open_blob", open_blob)
    monkeypatch.setattr(retry.RequestCounter, "count", count)
    monkeypatch.setattr(ls, "acquire_pinned", seen.leased(ls.acquire_pinned))
    yield seen



def mint(v: View, out_url: str, run_id: str) -> Description:
    """The mint task: each input's frontiers once, then the output's head once."""
    frontiers = input_frontiers(v)
    d = mint_view(v, output_url=out_url, initial_upper=0, interval_end=None, max_span=None, dag_id="v",
                  run_id=run_id, attempt=1, frontiers=frontiers)
    assert isinstance(d, Description)
    return d


def write_check(v: View, out_url: str, d: Description) -> ViewWriteRequest:
    """The write task's operator side: the committed check, and the job's typed request."""
    op = ViewWriteOperator(task_id="write", shard_url=out_url, view_spec=v.spec(), desc=to_builtins(d), slot=0,
                           application="app.py")
    assert op.committed_already(d) is None
    return decode_request(op.job_args(d)[1], ViewWriteRequest)


def one_run(spark: Any, v: View, src: Shard, out_url: str, run_id: str, reads: Reads,
            fates: Counter[str]) -> dict[str, dict[str, int]]:
    """One view run, task by task; returns each task's fact reads per shard ("in", "out") and
    checks each task decides each fate at most once."""
    per_task: dict[str, dict[str, int]] = {}

    def task(name: str) -> None:
        per_task[name] = {"in": reads.of(src.url), "out": reads.of(out_url)}
        assert all(n <= 1 for n in fates.values()), (name, fates)
        reads.clear()
        fates.clear()

    reads.clear()
    fates.clear()
    d = mint(v, out_url, run_id)
    task("mint")
    req = write_check(v, out_url, d)
    task("write check")
    summary = write_view(spark, v, output_url=req.shard_url, desc=req.desc, decided_at=req.decided_at)
    assert summary["status"] == "staged"
    task("write job")
    results = list(append_chain(Shard(out_url), [d], 1, writer=f"airflow:v/{run_id}"))
    assert [r.status for _, r in results] == ["committed"]  # type: ignore[union-attr]
    task("append")
    return per_task


@pytest.mark.parametrize("sql", [AGGREGATE, ROW_WISE], ids=["aggregate", "row-wise"])
def test_each_task_of_a_view_run_reads_each_head_once_and_decides_each_fate_once(
        spark: Any, tmp_path: Path, reads: Reads, fates: Counter[str], sql: str) -> None:
    src = Shard.create(f"file://{tmp_path}/events", SCHEMA)
    out_url = f"file://{tmp_path}/view"
    v = view(inputs={"events": src.url}, sql=sql)
    src.append(_events([("a", "buy", 5, 1), ("b", "buy", 7, 3), ("c", "click", 2, 4)]), lower=0, upper=10)
    first = one_run(spark, v, src, out_url, "r1", reads, fates)
    src.append(_events([("a", "buy", 3, 12), ("d", "view", 4, 14)]), lower=10, upper=20)
    steady = one_run(spark, v, src, out_url, "r2", reads, fates)

    # The first run: no output shard yet (its write check and the job find none; the job creates it).
    assert first["mint"] == {"in": 1, "out": 1}
    assert first["write check"] == {"in": 0, "out": 1}
    assert first["write job"]["in"] == 1
    assert first["append"] == {"in": 0, "out": 1}
    # A steady run: the job works from the version its task decided at (no head read of the output).
    assert steady == {"mint": {"in": 1, "out": 1}, "write check": {"in": 0, "out": 1},
                      "write job": {"in": 1, "out": 0}, "append": {"in": 0, "out": 1}}
    assert Shard(out_url).info().upper == 20


def test_a_write_without_a_decision_reads_the_output_head_once(spark: Any, tmp_path: Path, reads: Reads,
                                                               fates: Counter[str]) -> None:
    """A job submitted by hand (no ``decided_at``) reads the output's head once and decides once."""
    src = Shard.create(f"file://{tmp_path}/events", SCHEMA)
    out_url = f"file://{tmp_path}/view"
    v = view(inputs={"events": src.url}, sql=AGGREGATE)
    src.append(_events([("a", "buy", 5, 1)]), lower=0, upper=10)
    d = mint(v, out_url, "r1")
    write_view(spark, v, output_url=out_url, desc=d)
    list(append_chain(Shard(out_url), [d], 1))
    src.append(_events([("b", "buy", 7, 12)]), lower=10, upper=20)
    d2 = mint(v, out_url, "r2")
    reads.clear()
    fates.clear()
    assert write_view(spark, v, output_url=out_url, desc=d2)["status"] == "staged"
    assert (reads.of(src.url), reads.of(out_url)) == (1, 1)
    assert fates == Counter({d2.desc_id: 1})
