"""``spark.read.format("shardsink")``: a Spark 4 Python data source over a shard's parts.

Register once per session with :func:`register` (the read helpers do it), then::

    spark.read.format("shardsink").option("as_of", T).load(URL)                  # mode=snapshot
    spark.read.format("shardsink").option("mode", "changes")
        .option("from", A).option("to", B).load(URL)

**What a partition returns, and why it is not consolidated.** One Spark partition reads
one part, or a group of small parts packed up to ``partitionBytes`` (default 64 MiB of
Parquet; lowered so that there are at least ``minPartitions`` groups when there are as
many parts, default 1; the read helpers pass Spark's default parallelism). The same
row can appear in parts of different batches (an insert in one, its retraction in
another), so no partition can consolidate on its own. Instead of partitioning by a hash
of the row (every task would read every part), the source emits *updates* and leaves
the global sum to a Spark aggregation:

* ``mode=snapshot``: user columns + ``_diff``: every update with ``_time <= as_of``, time
  dropped. The contents as of ``as_of`` are ``sum(_diff)`` per distinct row; a row with
  several entries is *not* duplicated content. :func:`shardsink.spark.read.read_snapshot`
  does the ``groupBy`` (whose map-side partial aggregation is the per-partition
  consolidation), names the sum ``_count`` like :meth:`Shard.snapshot`, and fails the
  job on a negative sum (corruption).
* ``mode=changes``: user columns + ``_time`` + ``_diff`` for ``from <= _time < to``, times
  below ``since`` read as ``since`` (as :meth:`Shard.changes`; compaction may store them
  either way). A sorted
  part is consolidated per ``(row, _time)`` (an unordered part is not), and parts staged by
  several Spark tasks for one batch may repeat a ``(row, _time)``;
  :func:`~shardsink.spark.read.read_changes` consolidates globally.

**Planning happens at ``load()``** (in a Python worker the JVM starts on the driver):
the state is read once, the frontier checked (ReadFrontierError, before any job), and the
plan (:func:`shardsink.core.plan.plan`, the one planner of every reader: parts, time
pruning, projections) is pinned in the source, so every action on the DataFrame reads the
same parts. ``.option("seqno", N)`` plans on an explicit version (the read helpers pass the
one their lease pinned, :func:`source_options`).

**Schema evolution.** Columns are those of the reader's schema: ``.option("schema", ...)``
``current`` (default), ``as_of`` (the one current at ``as_of``; changes: at
``max(from, to - 1)``, as :meth:`Shard.changes`) or a schema id (the read helpers pass the
one they resolved). Each part is read through its plan's projection
(:class:`shardsink.core.plan.PartRead`), never by the part file's column names.

HAZARDS: executors open the store themselves (boto3 with the standard AWS environment:
``AWS_ENDPOINT_URL``, credentials) and need ``shardsink`` importable; a missing or
unreadable part fails the task with CorruptionError. Without a lease
(:mod:`shardsink.core.leases`) nothing stops compaction/GC from removing pinned parts
during a long job: prefer the read helpers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from shardsink.core import floats as fl
from shardsink.core import plan as pl
from shardsink.core.plan import PartRead, ReadPlan, SchemaChoice
from shardsink.core.shard import Shard
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError, InvalidUsageError, ReadFrontierError
from shardsink.outcome import carry_errors
from shardsink.spark import types as sty
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

NAME = "shardsink"
DEFAULT_PARTITION_BYTES = 64 * 1024 * 1024
BATCH_ROWS = 128 * 1024
MIN_TIME = -(2**63)
MIN_GROUP_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class TaskSizes:
    """How a source read is cut into Spark tasks and Arrow batches (options ``partitionBytes``,
    ``minPartitions``, ``batchRows``)."""

    partition_bytes: int = DEFAULT_PARTITION_BYTES
    min_partitions: int = 1
    batch_rows: int = BATCH_ROWS

    @classmethod
    def of(cls, options: Mapping[str, str]) -> TaskSizes:
        """The sizes ``options`` ask for (InvalidUsageError naming a value that is not an integer)."""
        return cls(_int_option(options, "partitionBytes") or DEFAULT_PARTITION_BYTES,
                   _int_option(options, "minPartitions") or 1, _int_option(options, "batchRows") or BATCH_ROWS)


def spark_schema(plan: ReadPlan) -> StructType:
    """The source's columns for ``plan``: the reader's user columns (+ ``_time`` for changes) + ``_diff``."""
    return sty.spark_schema(plan.schema, time=plan.mode == "changes", diff=DIFF)


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw))
    except ValueError:
        raise InvalidUsageError(f"option {name}={raw!r} is not an integer") from None


def plan_read(options: Mapping[str, str]) -> ReadPlan:
    """Read the shard's state once and plan the read (:func:`shardsink.core.plan.plan`; raises
    before any job)."""
    raw = options.get("path")
    if not raw:
        raise InvalidUsageError("no shard URL: use spark.read.format('shardsink').load(URL)")
    url = str(parse_url(str(raw)))
    mode = str(options.get("mode", "snapshot")).lower()
    if mode not in ("snapshot", "changes"):
        raise InvalidUsageError(f"option mode={mode!r:.120} is invalid; expected 'snapshot' or 'changes'")
    reader = Shard(url).reader()
    pinned = _int_option(options, "seqno")
    if pinned is None:
        v = reader.head()
    else:
        got = reader.version(pinned)
        if got is None:
            raise ReadFrontierError(f"state version {pinned} of {url} does not exist (or was collected)")
        v = got
    if mode == "snapshot":
        bounds = pl.Bounds.resolve(url, v.header, as_of=_int_option(options, "as_of"))
    else:
        lo, hi = _int_option(options, "from"), _int_option(options, "to")
        if lo is None or hi is None:
            raise InvalidUsageError("mode=changes needs both options 'from' and 'to' (times, [from, to))")
        bounds = pl.Bounds.resolve(url, v.header, changes=(lo, hi))
    target = pl.reader_schema(v.header, _schema_option(options.get("schema")), bounds, url=url)
    return pl.plan(url, v, reader.batches(v), bounds, target)


def _schema_option(choice: object) -> SchemaChoice | int:
    """Option ``schema``: ``current`` (None too), ``as_of`` or a schema id."""
    raw = "current" if choice is None else str(choice)
    if raw.lstrip("-").isdigit():
        return int(raw)
    if raw not in ("current", "as_of"):
        raise InvalidUsageError(f"option schema={raw!r:.120} is invalid; expected 'current', 'as_of' or a schema id",
                                value=raw[:120])
    return "current" if raw == "current" else "as_of"


def source_options(pinned: pl.Pinned) -> dict[str, str]:
    """The options that make the source plan exactly ``pinned``'s read (its bounds, reader
    schema id and pinned version): the read helpers' data-source path."""
    b = pinned.bounds
    out = {"seqno": str(pinned.version.seqno), "schema": str(pinned.target.id)}
    if b.lower is None:
        return {**out, "as_of": str(b.as_of)}
    return {**out, "mode": "changes", "from": str(b.lower), "to": str(b.upper)}


def isolated_parts(parts: Sequence[PartMeta], lower: int, upper: int) -> tuple[list[PartMeta], list[PartMeta]]:
    """``parts`` split into sorted parts whose times in ``[lower, upper)`` overlap no other
    part's, and the rest.

    A sorted part is consolidated on its own, and two parts can only hold the same
    ``(row, _time)`` if their time ranges overlap; so the updates of an isolated sorted part
    need no consolidation with any other part's. An unordered part may repeat a
    ``(row, _time)`` within itself: it always needs the consolidation.
    """
    spans = sorted((max(p.min_time, lower), min(p.max_time, upper - 1), i) for i, p in enumerate(parts))
    shared: set[int] = {i for i, p in enumerate(parts) if not p.is_sorted}
    reach, owner = MIN_TIME - 1, -1  # the furthest end so far, and the part that has it
    for lo, hi, i in spans:
        if lo <= reach:
            shared.update((i, owner))
        if hi > reach:
            reach, owner = hi, i
    alone = [p for i, p in enumerate(parts) if i not in shared]
    return alone, [p for i, p in enumerate(parts) if i in shared]


class PartGroup(InputPartition):
    """The parts one Spark task reads, as planned."""

    def __init__(self, index: int, reads: tuple[PartRead, ...]) -> None:
        super().__init__(index)
        self.reads = reads


def group_parts(parts: tuple[PartMeta, ...], target_bytes: int, min_groups: int = 1) -> list[tuple[PartMeta, ...]]:
    """Pack parts (in key order) into groups of at most ``target_bytes``; a big part is alone.

    The target shrinks to ``total / min_groups`` (not below 4 MiB, like Spark's file
    splits) so that a small read still spreads over ``min_groups`` tasks.
    """
    if min_groups > 1 and parts:
        target_bytes = min(target_bytes, max(MIN_GROUP_BYTES, sum(p.bytes for p in parts) // min_groups))
    groups: list[list[PartMeta]] = []
    size = 0
    for p in sorted(parts, key=lambda p: p.key):
        if not groups or size + p.bytes > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.bytes
    return [tuple(g) for g in groups]


class ShardReader(DataSourceReader):
    def __init__(self, plan: ReadPlan, sizes: TaskSizes) -> None:
        self.plan = plan
        self.sizes = sizes

    def partitions(self) -> list[InputPartition]:
        by_key = {r.part.key: r for r in self.plan.parts}
        groups = group_parts(tuple(by_key[k].part for k in by_key), self.sizes.partition_bytes,
                             self.sizes.min_partitions)
        return [PartGroup(i, tuple(by_key[p.key] for p in g)) for i, g in enumerate(groups)] or [PartGroup(0, ())]

    @carry_errors  # runs on executors: a missing part reaches the driver as a CorruptionError record
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        plan = self.plan
        reads: tuple[PartRead, ...] = getattr(partition, "reads", ())
        if not reads:
            return
        reader = Shard(plan.url).reader()  # retries idempotent reads (shardsink.storage.retry)
        wire = sty.arrow_wire_schema(spark_schema(plan))
        for r in reads:
            f = reader.open_part(r.part, referenced_by=f"state {plan.seqno}")
            yield from _batches(f, r, plan, wire, self.sizes.batch_rows)


def _batches(f: pq.ParquetFile, r: PartRead, plan: ReadPlan, wire: pa.Schema,
             batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The part's updates within the plan's time bounds, cast to the wire schema."""
    # Where each wire column comes from: the part's own column names (None: nulls).
    names: list[str | None] = [*(c.source for c in r.projection), *wire.names[len(r.projection):]]
    read = [n for n in names if n is not None]
    cols = list(dict.fromkeys([*read, TIME])) if r.cut else list(dict.fromkeys(read))
    for batch in f.iter_batches(batch_size=batch_rows, columns=cols):
        batch = fl.canonical_batch(batch)  # one float equality with every other path (core/floats.py)
        if r.advance:  # times below since read as since (they may be stored either way)
            i = batch.schema.get_field_index(TIME)
            batch = batch.set_column(i, batch.schema.field(i),
                                     pc.max_element_wise(batch.column(i), pa.scalar(plan.since, pa.int64())))
        if r.cut:
            t, lower = batch.column(TIME), MIN_TIME if plan.lower is None else plan.lower
            batch = batch.filter(pc.and_(pc.greater_equal(t, lower), pc.less(t, plan.upper)))
            if batch.num_rows == 0:
                continue
        try:
            yield pa.RecordBatch.from_arrays([pa.nulls(batch.num_rows, w.type) if n is None else
                                              batch.column(n).cast(w.type) for n, w in zip(names, wire, strict=True)],
                                             schema=wire)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as e:
            raise CorruptionError(f"part {plan.url}/{r.part.key} does not match the shard schema: {e}") from e


class ShardDataSource(DataSource):
    """The ``shardsink`` format; see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        self.plan = plan_read(self.options)
        return spark_schema(self.plan)

    def reader(self, schema: StructType) -> DataSourceReader:
        plan: ReadPlan | None = getattr(self, "plan", None)
        if plan is None:  # the user passed .schema(...): plan now, and insist it matches
            plan = plan_read(self.options)
            if spark_schema(plan).simpleString() != schema.simpleString():
                raise InvalidUsageError(
                    f"schema {sty.describe(schema)} does not match the shard's {sty.describe(spark_schema(plan))}"
                )
        return ShardReader(plan, TaskSizes.of(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("shardsink")`` available in ``spark`` (idempotent). Its reads run Python on
    the executors: a Connect session's deferred check of the server's Python runs first."""
    from shardsink.sources.base import before_python_tasks

    before_python_tasks(spark)
    spark.dataSource.register(ShardDataSource)
