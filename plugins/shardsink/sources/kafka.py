"""A Kafka topic, reclocked: partition offsets bound to shard times through a remap shard.

Records are JSON objects (the message value) holding the shard's user columns;
``offset_columns=True`` adds ``kafka_partition`` and ``kafka_offset`` (int64) columns
to each row (declare them in the shard's columns too). The Spark executors read their
offset ranges with kafka-python (no JVM Kafka connector): each range is read by
assigning the partition, seeking to its start and polling until the consumer's position
reaches its end.

Binding (on mint): the frontier is each partition's high watermark. Partitions that
appear between runs start at offset 0 (their first offset, if retention already removed
some, is reported as a gap error on read rather than skipped silently).

After each data commit the resumption frontier (the minimum upper of the output shards,
mapped back through the remap shard) is committed as the consumer group's offsets, so
standard lag monitoring shows how far the shards are behind the topic. That commit is
informative only: shardsink never reads it back (the remap shard is the only progress
store).

SUBTLE (high watermark): ``probe="fetch"`` (the default) learns each partition's high
watermark from a fetch response; ``probe="end_offsets"`` uses ListOffsets, which is
cheaper on Apache Kafka but was seen to under-report on Tansu 0.6.0 when a producer batched
several records into one request (``end_offsets()`` 1 per partition for 10 records). An
under-reported frontier only delays records to a later binding; it never loses or duplicates them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from shardsink.core.state_codec import schema_from_json, schema_to_json
from shardsink.core.updates import TIME
from shardsink.errors import InvalidUsageError, StorageError
from shardsink.reclock.bindings import Bindings, Span, split
from shardsink.reclock.remap import Proposal
from shardsink.reclock.source import ReclockedBase, Routing, resumption
from shardsink.sources.base import Seal, map_on_executors, spread_rows
from shardsink.sources.landing import MalformedInputError, parse_columns
from shardsink.sources.stamp import stamp
from shardsink.specs import KafkaSpec, spec_as, spec_to_builtins

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Probe = Literal["fetch", "end_offsets"]
PARTITION_COLUMN, OFFSET_COLUMN = "kafka_partition", "kafka_offset"
#: Client settings that hold credentials (``sasl_plain_password``, ``ssl_password``, tokens): never in a spec.
_CREDENTIAL_WORDS = ("password", "secret", "token")


class KafkaSource(ReclockedBase):
    """Topic ``topic`` on ``bootstrap`` (``host:port,...``), bound through the remap shard ``remap``.

    ``group_id``: the consumer group whose offsets mirror the resumption frontier.
    ``chunk``: offsets per unit of work dealt to writer slots. ``client`` holds extra
    kafka-python settings that are not secrets (security settings come from the
    environment of the process, never from the spec).
    """

    kind = "kafka"
    spec_type = KafkaSpec

    def __init__(self, bootstrap: str, topic: str, *, remap: str, group_id: str | None = None,
                 schema: pa.Schema | None = None, columns: Mapping[str, str] | None = None,
                 offset_columns: bool = False, probe: Probe = "fetch", chunk: int = 50_000,
                 read_timeout_s: float = 60.0, routing: Routing | None = None,
                 client: Mapping[str, Any] | None = None) -> None:
        super().__init__(remap=remap, routing=routing or Routing())
        if not bootstrap or not topic:
            raise InvalidUsageError(f"bootstrap {bootstrap!r} and topic {topic!r} must be non-empty")
        if probe not in ("fetch", "end_offsets") or chunk < 1:
            raise InvalidUsageError(f"probe {probe!r} must be 'fetch' or 'end_offsets' and chunk {chunk} >= 1")
        self.bootstrap, self.topic = bootstrap, topic
        self.group_id = group_id or f"shardsink-{topic}"
        self._schema = schema if schema is not None else (parse_columns(columns) if columns else None)
        self.offset_columns, self.probe, self.chunk = offset_columns, probe, chunk
        self.read_timeout_s = read_timeout_s
        secret = sorted(k for k in (client or {}) if any(w in k.lower() for w in _CREDENTIAL_WORDS))
        if secret:
            raise InvalidUsageError(
                f"kafka client settings {secret} look like credentials: a spec travels in DAG settings, on the "
                "spark-submit command line and in sidecars, so it must never hold a secret", value=secret[0])
        self.client = dict(client or {})

    def typed_spec(self) -> KafkaSpec:
        """The spec as data (:mod:`shardsink.specs`)."""
        r = self.routing.spec()
        return KafkaSpec(bootstrap=self.bootstrap, topic=self.topic, remap=self.remap_url, group_id=self.group_id,
                         offset_columns=self.offset_columns, probe=self.probe, chunk=self.chunk,
                         read_timeout_s=self.read_timeout_s, client=self.client or None,
                         schema=schema_to_json(self._schema) if self._schema is not None else None,
                         outputs=r.get("outputs"), route_by=r.get("route_by"), output=r.get("output"))

    def spec(self) -> dict[str, Any]:
        """The spec's dict layout (what DAG settings and executors carry); a subclass's own
        ``kind`` (``"module:Class"``) is kept."""
        out = spec_to_builtins(self.typed_spec())
        out["kind"] = self.kind
        return out

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | KafkaSpec) -> KafkaSource:
        s = spec_as(spec, KafkaSpec)
        return cls(s.bootstrap, s.topic, remap=s.remap, group_id=s.group_id,
                   schema=schema_from_json(s.schema) if s.schema is not None else None, columns=s.columns,
                   offset_columns=s.offset_columns, probe=s.probe, chunk=s.chunk, read_timeout_s=s.read_timeout_s,
                   routing=Routing(dict(s.outputs or {}), s.route_by, s.output), client=s.client)

    def for_output(self, output: str) -> KafkaSource:
        s = self.spec()
        s.update(Routing(self.routing.outputs, self.routing.route_by, output).spec())
        return KafkaSource.from_spec(s)

    def schema(self) -> pa.Schema | None:
        return self._schema

    # --- kafka-python -----------------------------------------------------------------

    def consumer(self, **kw: Any) -> Any:
        from kafka import KafkaConsumer

        return KafkaConsumer(bootstrap_servers=self.bootstrap.split(","), enable_auto_commit=False,
                             **{**self.client, **kw})

    def partitions(self, consumer: Any) -> set[int]:
        """The topic's partitions now (a test may override this to model added partitions)."""
        parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            raise StorageError(f"topic {self.topic!r} on {self.bootstrap} does not exist or has no partitions")
        return set(parts)

    def high_watermarks(self, consumer: Any, parts: set[int], start: Mapping[int, int]) -> dict[int, int]:
        from kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        if self.probe == "end_offsets":
            return {tp.partition: int(o) for tp, o in consumer.end_offsets(tps).items()}
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, max(0, start.get(tp.partition, 0) - 1))
        deadline = time.monotonic() + self.read_timeout_s
        while any(consumer.highwater(tp) is None for tp in tps):
            if time.monotonic() > deadline:
                missing = [tp.partition for tp in tps if consumer.highwater(tp) is None]
                raise StorageError(f"no fetch answer for partitions {missing} of {self.topic!r} on {self.bootstrap}")
            consumer.poll(timeout_ms=200, max_records=1)
        return {tp.partition: int(consumer.highwater(tp)) for tp in tps}

    # --- binding (driver, in mint) -----------------------------------------------------

    def propose(self, bindings: Bindings) -> Proposal:
        bound = {int(p): o for p, o in bindings.latest().items()}
        c = self.consumer(max_partition_fetch_bytes=1024)
        try:
            hw = self.high_watermarks(c, self.partitions(c) | set(bound), bound)
        finally:
            c.close()
        # A new partition starts at 0; a known one never moves back (check_monotonic refuses that).
        return Proposal({str(p): o for p, o in sorted(hw.items())})

    def after_commit(self, shard_url: str) -> None:
        """Commit the resumption frontier as the consumer group's offsets."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        frontier, _ = resumption(self.remap().bindings(), self.routing.shard_urls(shard_url))
        if not frontier:
            return
        c = self.consumer(group_id=self.group_id)
        try:
            c.commit({TopicPartition(self.topic, int(p)): OffsetAndMetadata(o, "", -1) for p, o in frontier.items()})
        finally:
            c.close()

    def committed_offsets(self) -> dict[int, int | None]:
        """The consumer group's committed offsets (what lag monitoring sees)."""
        from kafka import TopicPartition

        c = self.consumer(group_id=self.group_id)
        try:
            return {p: c.committed(TopicPartition(self.topic, p)) for p in sorted(self.partitions(c))}
        finally:
            c.close()

    # --- reading (write job) -------------------------------------------------------------

    def read_span(self, consumer: Any, s: Span, schema: pa.Schema) -> pa.Table:
        """The records of offsets ``[s.start, s.end)`` of partition ``s.partition`` as user columns."""
        from kafka import TopicPartition

        tp = TopicPartition(self.topic, int(s.partition))
        consumer.assign([tp])
        consumer.seek(tp, s.start)
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + self.read_timeout_s
        where = f"kafka://{self.bootstrap}/{self.topic}/{s.partition}@[{s.start},{s.end})"
        first = None
        while consumer.position(tp) < s.end:
            if time.monotonic() > deadline:
                raise StorageError(f"{where}: read stalled at offset {consumer.position(tp)} after "
                                   f"{self.read_timeout_s:g} s")
            for msgs in consumer.poll(timeout_ms=500).values():
                for m in msgs:
                    if m.offset >= s.end:
                        continue
                    first = m.offset if first is None else first
                    try:
                        row = json.loads(m.value)
                        if not isinstance(row, dict):
                            raise ValueError("not a JSON object")
                    except (ValueError, TypeError) as e:
                        raise MalformedInputError(f"{where}: offset {m.offset} is not a JSON object: {e}") from e
                    if self.offset_columns:
                        row[PARTITION_COLUMN], row[OFFSET_COLUMN] = int(s.partition), m.offset
                    rows.append(row)
        if first is not None and first > s.start and s.start == 0:
            raise MalformedInputError(f"{where}: offsets [{s.start}, {first}) were deleted by retention before "
                                      "they were read; they cannot be ingested")
        names = [*schema.names]
        extra = sorted({k for r in rows for k in r} - set(names))
        if extra:
            raise MalformedInputError(f"{where}: records have fields {extra[:5]} that are not shard columns {names}")
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise MalformedInputError(f"{where}: records do not fit the shard's columns: {e}") from e

    def read_slot(self, spark: SparkSession, *, lower: int, upper: int, slot: int, slots: int, schema: pa.Schema,
                  seals: Sequence[Seal] = ()) -> tuple[DataFrame, list[dict[str, Any]]]:
        """This slot's chunks of the offset ranges bound at times in ``[lower, upper)``, stamped."""
        from pyspark.sql.pandas.types import from_arrow_schema

        mine = split(self.bound_input(lower, upper).spans, slot=slot, slots=slots, chunk=self.chunk)
        listing = [{"partition": s.partition, "start": s.start, "end": s.end, "time": s.time} for s in mine]
        spark_schema = from_arrow_schema(pa.schema([*schema, pa.field(TIME, pa.int64())]))
        if not mine:
            return spark.createDataFrame([], spark_schema), listing
        spec, schema_bytes = self.spec(), schema.serialize().to_pybytes()

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            src = KafkaSource.from_spec(spec)
            user = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
            c = src.consumer()
            try:
                for batch in batches:
                    for r in batch.to_pylist():
                        s = Span(r["partition"], r["start"], r["end"], r["time"])
                        where = f"kafka {src.topic}/{s.partition}@[{s.start},{s.end})"
                        t = src.routing.select(src.read_span(c, s, user), where=where)
                        yield from stamp(t, user, s.time, where=where).to_batches()
            finally:
                c.close()

        rows = [(s.partition, s.start, s.end, s.time) for s in mine]
        df = spread_rows(spark, rows, "partition string, start long, end long, time long")
        return map_on_executors(df, read, spark_schema), listing
