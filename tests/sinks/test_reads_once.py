"""Each fact read once (issue 18, step 6), per task of one ingest run on the local backend:
the shard's head at most once, each description's fate decided at most once, and the
source's watermark once per run.

The run is the ingest steps of :mod:`shardsink.sinks.ingest` without Airflow, each task on a
fresh handle as the Airflow tasks open them: mint (``open_with_info``, ``read_watermark``,
``mint_chain`` from what was seen), the write's committed check (``committed``), append
(``append_chain``). Head reads are counted with the retrying blob's public request counter
(GETs of ``state/LATEST.json`` and listings of ``state/v/``); watermark reads as the GETs of
the landing zone's ``_watermark.json`` on the source's one store handle; fate decisions by a
pass-through spy on :func:`shardsink.core.fate.decide`, the one rule every fate goes through.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from shardsink import hooks
from shardsink.core.shard import Shard
from shardsink.sinks.append import append_chain
from shardsink.sinks.description import Description
from shardsink.sinks.ingest import Seen, committed, mint_chain, open_with_info, read_watermark
from shardsink.sinks.staging import write_manifest
from shardsink.sources.landing import WATERMARK_KEY, LandingSource
from shardsink.storage.base import Blob
from shardsink.storage.retry import key_class
from shardsink.storage.url import open_blob
from shardsink_dev.synthetic import DAY, SCHEMA, generate

SLOTS = 2
DAYS = 3


class OneStoreLanding(LandingSource):
    """The real landing source over ONE store handle, so all its requests are counted together."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.store = open_blob(self.url)

    def blob(self) -> Blob:
        return self.store

    def watermark_reads(self) -> int:
        return int(self.store.requests_by_kind[("get", key_class(WATERMARK_KEY))])  # type: ignore[attr-defined]


def head_reads(shard: Shard) -> int:
    by = shard.request_counter().by_kind
    return int(by[("get", key_class("state/LATEST.json"))] + by[("list", "state/v")])



@pytest.fixture
def run(tmp_path: Any) -> tuple[str, OneStoreLanding]:
    """An existing shard at 0 and a landing zone with DAYS days complete (watermark at their end)."""
    url = f"file://{tmp_path}/shard"
    generate(f"file://{tmp_path}/landing", start=0, days=DAYS, files_per_day=1, rows_per_file=5)
    Shard.create(url, SCHEMA, upper=0)
    return url, OneStoreLanding(f"file://{tmp_path}/landing")


def mint(url: str, source: OneStoreLanding) -> tuple[Shard, list[Description]]:
    """The mint task's reads and chain: the head once, the watermark once, both handed down."""
    shard, info = open_with_info(url, source, initial_upper=0)
    seen = Seen(info, read_watermark(source))
    chain = mint_chain(shard, source, interval_end=DAYS * DAY, max_span=DAY, max_chain=16, dag_id="d",
                       run_id="r", attempt=1, seen=seen)
    assert isinstance(chain, list)
    return shard, chain


def stage_all(url: str, chain: list[Description]) -> None:
    """What the write jobs leave behind (parts and manifests); not a task under test here."""
    staging = Shard(url)
    for d in chain:
        for slot in range(SLOTS):
            t = pa.table({"user": [f"u{slot}"], "action": ["x"], "amount": [slot], "_time": [d.lower + slot]})
            s = staging.stage(t, lower=d.lower, upper=d.upper, desc_id=d.desc_id, schema=SCHEMA)
            write_manifest(staging, d, slot=slot, slots=SLOTS, parts=s.parts, schema_id=s.schema_id)


def test_a_mint_reads_the_head_once_and_the_watermark_once(run: tuple[str, OneStoreLanding],
                                                           fates: Counter[str]) -> None:
    url, source = run
    shard, chain = mint(url, source)
    assert [(d.lower, d.upper) for d in chain] == [(k * DAY, (k + 1) * DAY) for k in range(DAYS)]
    assert head_reads(shard) == 1
    assert source.watermark_reads() == 1
    assert not fates


def test_a_write_check_reads_the_head_once_and_decides_the_fate_once(run: tuple[str, OneStoreLanding],
                                                                     fates: Counter[str]) -> None:
    url, source = run
    _, chain = mint(url, source)
    for d in chain:
        for _slot in range(SLOTS):
            fates.clear()
            task = Shard(url)  # each mapped write task opens its own handle
            assert committed(task, d) is None
            assert head_reads(task) <= 1
            assert fates[d.desc_id] <= 1 and sum(fates.values()) == fates[d.desc_id]


def test_an_append_reads_the_head_once_and_decides_each_fate_once(run: tuple[str, OneStoreLanding],
                                                                  fates: Counter[str]) -> None:
    url, source = run
    _, chain = mint(url, source)
    stage_all(url, chain)
    fates.clear()
    task = Shard(url)
    results = list(append_chain(task, chain, SLOTS, writer="airflow:d/r"))
    assert [r.status for _, r in results] == ["committed"] * DAYS  # type: ignore[union-attr]
    assert Shard(url).info().upper == DAYS * DAY
    assert not list(task._machine.blob.list("staging/"))  # every description's manifests were cleaned up
    assert head_reads(task) <= 1
    assert all(n <= 1 for n in fates.values()), fates


def test_an_append_decides_each_fate_at_most_once_before_its_commit(run: tuple[str, OneStoreLanding],
                                                                     fates: Counter[str]) -> None:
    """Up to each commit attempt (hook ``append.before_commit``): the first description's fate is
    the task's one head read; each later one's is the version that committed the one before it
    (no read, no decision)."""
    url, source = run
    _, chain = mint(url, source)
    stage_all(url, chain)
    fates.clear()
    task = Shard(url)
    at_commit: list[tuple[str, int, int]] = []

    def before_commit(*, desc_id: str, **_: Any) -> None:
        at_commit.append((desc_id, fates[desc_id], head_reads(task)))

    remove = hooks.register("append.before_commit", before_commit)
    try:
        results = list(append_chain(task, chain, SLOTS, writer="airflow:d/r"))
    finally:
        remove()
    assert [r.status for _, r in results] == ["committed"] * DAYS  # type: ignore[union-attr]
    assert [(i, n) for i, n, _ in at_commit] == [(chain[0].desc_id, 1)] + [(d.desc_id, 0) for d in chain[1:]]
    assert at_commit[0][2] == 1  # the first commit attempt starts from the task's one head read


def test_an_ingest_run_reads_the_watermark_once(run: tuple[str, OneStoreLanding]) -> None:
    url, source = run
    _, chain = mint(url, source)
    for d in chain:
        committed(Shard(url), d)
    stage_all(url, chain)
    list(append_chain(Shard(url), chain, SLOTS, writer="airflow:d/r"))
    assert Shard(url).info().upper == DAYS * DAY
    assert source.watermark_reads() == 1


def test_a_first_mint_creates_the_missing_shard(tmp_path: Any) -> None:
    """The one exception to one head read: creating the shard (the create checks nothing is there)."""
    generate(f"file://{tmp_path}/landing", start=0, days=1, files_per_day=1, rows_per_file=5)
    source = OneStoreLanding(f"file://{tmp_path}/landing")
    shard, info = open_with_info(f"file://{tmp_path}/new", source, initial_upper=7)
    assert (info.seqno, info.upper) == (0, 7) and Shard.open(shard.url).info().upper == 7
