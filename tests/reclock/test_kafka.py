"""Kafka, reclocked, against a real Kafka-protocol broker (Tansu) with real Spark executors."""

from __future__ import annotations

from typing import Any

from rc_helpers import (
    DAY,
    SCHEMA,
    START,
    assert_exactly_once,
    assert_no_leaks,
    create_topic,
    produce,
    run_once,
    times_of,
)

from shardsink import Shard
from shardsink.reclock.remap import RemapShard
from shardsink.reclock.source import Routing
from shardsink.sources.kafka import KafkaSource


def test_topic_is_ingested_exactly_once_and_group_offsets_follow_the_resumption_frontier(
        spark: Any, kafka: str, tmp_path: Any) -> None:
    topic = create_topic(kafka, 2)
    data, remap = (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    src = KafkaSource(kafka, topic, remap=remap, schema=SCHEMA, chunk=7)
    ids = produce(kafka, topic, range(0, 40), partitions=2)  # batched: end_offsets would under-report
    run_once(spark, data, src, interval_end=START + DAY)
    assert src.committed_offsets() == {0: 20, 1: 20}
    ids += produce(kafka, topic, range(40, 50), partitions=2)
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_exactly_once(data, ids)
    assert_no_leaks(data)
    t = times_of(data)
    assert {t[i] for i in range(40)} == {START + DAY - 1} and {t[i] for i in range(40, 50)} == {START + 2 * DAY - 1}
    assert [b.frontier for b in RemapShard.open(remap).bindings().history] == [{"0": 20, "1": 20},
                                                                               {"0": 25, "1": 25}]
    assert src.committed_offsets() == {0: 25, 1: 25}
    assert src.resumption(data) == ({"0": 25, "1": 25}, START + 2 * DAY)


class GrowingTopic(KafkaSource):
    """Tansu 0.6 refuses CreatePartitions, so the topic has 3 partitions from the start and
    the source is shown only some of them at first, as if the others were added later."""

    visible = 2

    def partitions(self, consumer: Any) -> set[int]:
        return {p for p in super().partitions(consumer) if p < GrowingTopic.visible}


def test_a_partition_added_between_runs_is_read_from_offset_zero(spark: Any, kafka: str, tmp_path: Any) -> None:
    topic = create_topic(kafka, 3)
    data, remap = (tmp_path / "events").as_uri(), (tmp_path / "remap").as_uri()
    src = GrowingTopic(kafka, topic, remap=remap, schema=SCHEMA)
    ids = produce(kafka, topic, range(0, 30), partitions=3)  # partition 2 already holds 10 records
    GrowingTopic.visible = 2
    run_once(spark, data, src, interval_end=START + DAY)
    assert len(times_of(data)) == 20
    GrowingTopic.visible = 3
    run_once(spark, data, src, interval_end=START + 2 * DAY)
    assert_exactly_once(data, ids)
    assert RemapShard.open(remap).bindings().latest() == {"0": 10, "1": 10, "2": 10}
    assert {times_of(data)[i] for i in range(2, 30, 3)} == {START + 2 * DAY - 1}


def test_two_outputs_routed_by_key_are_each_exactly_once_and_resume_from_the_slower(
        spark: Any, kafka: str, tmp_path: Any) -> None:
    topic = create_topic(kafka, 2)
    a, b, remap = (tmp_path / "a").as_uri(), (tmp_path / "b").as_uri(), (tmp_path / "remap").as_uri()
    routing = Routing({"a": a, "b": b}, "route")
    src = KafkaSource(kafka, topic, remap=remap, schema=SCHEMA, routing=routing)
    ids = produce(kafka, topic, range(0, 40), partitions=2, route=lambda i: "ab"[i % 3 == 0])
    run_once(spark, a, src.for_output("a"), interval_end=START + DAY)
    run_once(spark, a, src.for_output("a"), interval_end=START + 2 * DAY)  # a is a day ahead of b
    ids += produce(kafka, topic, range(40, 60), partitions=2, route=lambda i: "ab"[i % 3 == 0])
    run_once(spark, b, src.for_output("b"), interval_end=START + DAY)
    assert src.resumption() == ({"0": 20, "1": 20}, START + DAY), "b is behind: resume from its upper"
    assert src.committed_offsets() == {0: 20, 1: 20}
    run_once(spark, b, src.for_output("b"), interval_end=START + 2 * DAY)
    run_once(spark, a, src.for_output("a"), interval_end=START + 3 * DAY)
    run_once(spark, b, src.for_output("b"), interval_end=START + 3 * DAY)
    assert_exactly_once(a, [i for i in ids if i % 3 != 0])
    assert_exactly_once(b, [i for i in ids if i % 3 == 0])
    assert Shard.open(a).info().upper == Shard.open(b).info().upper == START + 3 * DAY
    assert src.committed_offsets() == {0: 30, 1: 30}
