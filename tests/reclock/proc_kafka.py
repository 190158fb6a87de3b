"""Kafka crash-replay children: the steps of a reclocked ingest run, each in its own OS process
as in Airflow (the mint task, the write job, the append task), SIGKILLed at a chosen step:

* :func:`mint_step`: after the binding is durable, before anything is staged;
* :func:`write_and_die`: after slot 0 staged its parts and manifest (slot 1 never ran);
* :func:`append_step`: right before the conditional put of the data commit, right after it
  (before the consumer-group offsets are published), or with a group offset commit that
  fails after the shard commit.

:class:`GrowingKafka` shows the source only the partitions a control file names, so a test
can make partitions "appear" mid-run (Tansu 0.6.0 cannot add partitions to a topic, see
``test_kafka.GrowingTopic``). Progress is reported to the parent through a queue.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rc_helpers import mint_desc

from shardsink import Shard, hooks
from shardsink.sinks.append import LostRaceError, append_from_manifests
from shardsink.sinks.description import Description, to_builtins
from shardsink.sinks.seals import seals
from shardsink.sinks.staging import write_manifest
from shardsink.sources.kafka import KafkaSource
from shardsink.sources.publish import after_commit
from shardsink.spark.stage import stage_dataframe


class GrowingKafka(KafkaSource):
    """A Kafka source that sees partitions ``0 .. n-1`` only, ``n`` read from ``visible_file``."""

    kind = f"{__name__}:GrowingKafka"

    def __init__(self, *args: Any, visible_file: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.visible_file = visible_file

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "visible_file": self.visible_file}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> GrowingKafka:
        base = KafkaSource.from_spec(spec)
        out = cls(base.bootstrap, base.topic, remap=base.remap_url, group_id=base.group_id, schema=base.schema(),
                  chunk=base.chunk, visible_file=spec["visible_file"])
        return out

    def partitions(self, consumer: Any) -> set[int]:
        n = int(Path(self.visible_file).read_text())
        return {p for p in super().partitions(consumer) if p < n}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _reporting(out: Any, body: Any) -> None:
    try:
        body()
    except BaseException:
        out.put(("error", traceback.format_exc()))
        raise


def mint_step(shard_url: str, spec: dict[str, Any], end: int, run_id: str, die: bool, out: Any) -> None:
    """The mint task: bind and mint; SIGKILLed right after the binding if ``die``."""

    def body() -> None:
        d = mint_desc(shard_url, GrowingKafka.from_spec(spec), interval_end=end, run_id=run_id)
        if die:
            _die()
        out.put(("minted", to_builtins(d) if isinstance(d, Description) else None))

    _reporting(out, body)


def write_and_die(shard_url: str, spec: dict[str, Any], desc: dict[str, Any], slots: int, out: Any) -> None:
    """The write job of slot 0 (its own local Spark), SIGKILLed once its parts and manifest are staged."""

    def body() -> None:
        from shardsink_dev.testing import local_spark

        src, d, shard = GrowingKafka.from_spec(spec), Description.decode(desc), Shard.open(shard_url)
        with local_spark("kafka-write") as spark:
            df, inputs = src.read_slot(spark, lower=d.lower, upper=d.upper, slot=0, slots=slots, schema=shard.schema,
                                       seals=seals(shard))
            parts = stage_dataframe(df, shard_url=shard.url, schema=shard.schema, lower=d.lower, upper=d.upper,
                                    desc_id=d.desc_id)
            write_manifest(shard, d, slot=0, slots=slots, parts=parts, inputs=inputs)
            _die()

    _reporting(out, body)


def append_step(shard_url: str, spec: dict[str, Any], desc: dict[str, Any], slots: int, die_at: str,
                out: Any) -> None:
    """The append task: commit, then publish the group offsets (``after_commit``).

    ``die_at``: ``append`` (SIGKILL right before the conditional put), ``committed`` (right
    after the commit, before the offsets are published), ``group`` (publishing fails: the
    commit stands and the source's health records it), anything else: a clean append.
    """

    def body() -> None:
        if die_at == "append":
            hooks.register("append.before_commit", lambda **_: _die())
        if die_at == "committed":
            hooks.register("append.committed", lambda **_: _die())
        if die_at == "group":  # in this process only: every GrowingKafka fails to publish its offsets
            def fail(*_: Any, **__: Any) -> None:
                raise ConnectionError("injected: the group coordinator is unreachable")

            GrowingKafka.after_commit = fail  # type: ignore[method-assign]
        try:
            res = append_from_manifests(Shard.open(shard_url), Description.decode(desc), slots)
        except LostRaceError as e:
            out.put(("appended", f"lost: {e}"))
            return
        after_commit(spec, shard_url)  # what the append task does next (never fails the commit)
        out.put(("appended", res.status))

    _reporting(out, body)
