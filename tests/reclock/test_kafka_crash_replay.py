"""Kafka crash-replay on a real Kafka-protocol broker (Tansu): exactly once against the produced records.

Issue 17 item 13. Each round produces records, then runs one reclocked ingest run whose
steps are separate OS processes as under Airflow, one of them SIGKILLed, in an order
drawn at random (seeded; the seed is printed): the mint after its binding, the write job
after one slot staged, the append right before the data commit or right after it (before
the consumer-group offsets are published), or a run whose group offset commit fails
after the shard commit. A killed write or append is retried as Airflow retries the task.
A partition appears mid-run (it already holds records).
After every round nothing is duplicated; after a final clean run every produced record
is in the shard exactly once (counted independently from the shard's state files), the
orphans of killed runs are collected, and the group's committed offsets equal the
resumption frontier and the produced counts.
"""

from __future__ import annotations

import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import proc_kafka
from rc_helpers import (
    DAY,
    SCHEMA,
    START,
    assert_exactly_once,
    assert_matches_source,
    assert_no_leaks,
    create_topic,
    expect,
    id_counts,
    produce,
    run_once,
    spawn_ctx,
    write_slots,
)

from shardsink import Shard
from shardsink.maintenance.gc import collect
from shardsink.maintenance.gc_types import GcOptions
from shardsink.reclock.health import read as read_health
from shardsink.sinks.description import Description

PARTITIONS = 3
STEPS = ("mint", "write", "append", "committed", "group")


def _child(ctx: Any, target: Any, *args: Any) -> tuple[int | None, Any]:
    """Run one step in its own OS process; its exit code and its queue."""
    out = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, out))
    p.start()
    p.join(timeout=300)
    return p.exitcode, out


def _one_run(ctx: Any, spark: Any, data: str, src: Any, end: int, run_id: str, die_at: str) -> str:
    """One DAG run's steps as separate processes, the one named ``die_at`` SIGKILLed (or its
    group offset commit failing); Airflow's task retry follows a killed write or append."""
    spec = src.spec()
    code, out = _child(ctx, proc_kafka.mint_step, data, spec, end, run_id, die_at == "mint")
    if die_at == "mint":
        assert code == -signal.SIGKILL, code
        return "killed after binding"  # the run is gone; the next run mints afresh
    (doc,) = expect(out, "minted", timeout=5)
    assert code == 0 and doc is not None
    if die_at == "write":
        code, _ = _child(ctx, proc_kafka.write_and_die, data, spec, doc, 2)
        assert code == -signal.SIGKILL, code
    write_slots(spark, Shard.open(data), src, Description.from_dict(doc), slots=2)  # the write (retry)
    code, out = _child(ctx, proc_kafka.append_step, data, spec, doc, 2, die_at)
    if die_at in ("append", "committed"):
        assert code == -signal.SIGKILL, code
        code, out = _child(ctx, proc_kafka.append_step, data, spec, doc, 2, "none")  # Airflow's retry
    (status,) = expect(out, "appended", timeout=5)
    assert code == 0 and status == ("already_committed" if die_at == "committed" else "committed"), status
    return str(status)


def test_kafka_runs_killed_at_random_steps_replay_exactly_once(spark: Any, kafka: str, tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print(f"kafka crash-replay seed {seed}")
    rng = random.Random(seed)
    order = list(STEPS)
    rng.shuffle(order)
    topic = create_topic(kafka, PARTITIONS)
    visible = tmp_path / "visible-partitions"
    visible.write_text("2")
    data, remap = (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    src = proc_kafka.GrowingKafka(kafka, topic, remap=remap, schema=SCHEMA, chunk=7, visible_file=str(visible))
    ids: list[int] = []
    ctx = spawn_ctx()
    for r, die_at in enumerate(order):
        ids += produce(kafka, topic, range(15 * r, 15 * r + 15), partitions=PARTITIONS)
        if r == len(order) // 2:
            visible.write_text(str(PARTITIONS))  # partition 2 appears (holding records since round 0)
        _one_run(ctx, spark, data, src, START + (r + 1) * DAY, f"r{r}", die_at)
        if die_at == "group":
            h = read_health(remap)
            assert h is not None and "group coordinator is unreachable" in (h["error"] or ""), h
        counts = id_counts(data)
        assert all(c == 1 for c in counts.values()) and set(counts) <= set(ids), (seed, r, die_at)

    run_once(spark, data, src, interval_end=START + (len(order) + 1) * DAY, run_id="final")
    assert_exactly_once(data, ids)
    assert_matches_source(data, Counter(ids))  # replayed from the state files, not the library's reads
    collect(Shard.open(data), GcOptions(grace_s=0.0))  # killed runs' orphans can never commit: collected
    assert_no_leaks(data)
    produced = Counter(i % PARTITIONS for i in ids)
    frontier, _ = src.resumption(data)
    assert frontier == {str(p): produced[p] for p in range(PARTITIONS)}, seed
    assert src.committed_offsets() == {p: produced[p] for p in range(PARTITIONS)}, seed
