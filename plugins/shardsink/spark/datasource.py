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
the state is read once, the frontier checked (ReadFrontierError, before any job), and
the state version ``seqno`` and the part list are pinned in the source, so every action
on the DataFrame reads the same parts. ``.option("seqno", N)`` pins an explicit version
(the read helpers pin the one their lease protects).

**Schema evolution.** Columns are those of the reader's schema: ``.option("schema", ...)``
``current`` (default), ``as_of`` (the one current at ``as_of``; changes: at ``to - 1``, as
:meth:`Shard.changes`) or a schema id (the read helpers pass the one they resolved). A part
written under another schema id is read through it and projected by field id
(:func:`shardsink.core.schema.projection_for`): renamed columns from their old name, added
ones as typed nulls, widened ones cast, dropped ones not read. SUBTLE: a part may hold a
column of the reader's *name* with another field id (dropped, then added again): it is
never read for it; the projection comes from the plan, never from the part file.

HAZARDS: executors open the store themselves (boto3 with the standard AWS environment:
``AWS_ENDPOINT_URL``, credentials) and need ``shardsink`` importable; a missing or
unreadable part fails the task with CorruptionError. Without a lease
(:mod:`shardsink.core.leases`) nothing stops compaction/GC from removing pinned parts
during a long job: prefer the read helpers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from shardsink.core import floats as fl
from shardsink.core import schema as sch
from shardsink.core.read import ReadHandle
from shardsink.core.shard import Shard, check_as_of, check_changes
from shardsink.core.state import BatchMeta, Header, PartMeta, SchemaEntry
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
class ReadPlan:
    """What one ``load()`` reads: pinned version, bounds, parts (picklable)."""

    url: str
    mode: str  # "snapshot" | "changes"
    seqno: int
    lower: int  # snapshot: MIN_TIME; changes: from
    upper: int  # snapshot: as_of + 1; changes: to
    schema: bytes  # the reader's Arrow user schema, serialized
    parts: tuple[PartMeta, ...]
    partition_bytes: int
    min_partitions: int
    batch_rows: int = BATCH_ROWS
    #: changes from at or below since: times below it read as it (as Shard.changes does)
    advance_to: int | None = None
    #: parts written under another schema id than the reader's: for each user column of
    #: ``schema``, the part's column to read (None: typed nulls); absent parts read by name
    sources: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)

    @property
    def user_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema))

    def spark_schema(self) -> StructType:
        return sty.spark_schema(self.user_schema, time=self.mode == "changes", diff=DIFF)


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw))
    except ValueError:
        raise InvalidUsageError(f"option {name}={raw!r} is not an integer") from None


def plan_read(options: Mapping[str, str]) -> ReadPlan:
    """Read the shard's state once and decide what to read (raises before any job)."""
    raw = options.get("path")
    if not raw:
        raise InvalidUsageError("no shard URL: use spark.read.format('shardsink').load(URL)")
    url = str(parse_url(str(raw)))
    mode = str(options.get("mode", "snapshot")).lower()
    if mode not in ("snapshot", "changes"):
        raise InvalidUsageError(f"option mode={mode!r} is invalid; expected 'snapshot' or 'changes'")
    reader = Shard(url).reader()
    pinned = _int_option(options, "seqno")
    if pinned is None:
        v = reader.head()
    else:
        got = reader.version(pinned)
        if got is None:
            raise ReadFrontierError(f"state version {pinned} of {url} does not exist (or was collected)")
        v = got
    h = v.header
    batches = reader.batches(v)
    advance_to: int | None = None
    if mode == "snapshot":
        as_of = _int_option(options, "as_of")
        if as_of is None:
            if h.upper is None:
                raise ReadFrontierError(f"shard {url} is closed; pass an explicit as_of")
            as_of = h.upper - 1
        check_as_of(url, h, as_of)
        lower, upper = MIN_TIME, as_of + 1
        at = as_of
    else:
        lo, hi = _int_option(options, "from"), _int_option(options, "to")
        if lo is None or hi is None:
            raise InvalidUsageError("mode=changes needs both options 'from' and 'to' (times, [from, to))")
        check_changes(url, h, lo, hi)
        lower, upper = lo, hi
        advance_to = h.since if lo <= h.since else None
        at = max(lo, hi - 1)
    # Times below since are read as since (changes from since): every part below it counts.
    parts = select_parts(batches, MIN_TIME if advance_to is not None else lower, upper)
    layout = Layout.of(url, h, batches, reader_schema(url, h, options.get("schema"), at))
    size = _int_option(options, "partitionBytes") or DEFAULT_PARTITION_BYTES
    spread = _int_option(options, "minPartitions") or 1
    rows = _int_option(options, "batchRows") or BATCH_ROWS
    return ReadPlan(url, mode, v.seqno, lower, upper, layout.schema.serialize().to_pybytes(), tuple(parts), size,
                    spread, rows, advance_to if mode == "changes" else None, layout.sources(parts))


def reader_schema(url: str, h: Header, choice: object, time: int) -> SchemaEntry:
    """The schema a read projects onto: option ``schema`` = ``current`` (None too), ``as_of``
    (the one current at data time ``time``) or a schema id the shard knows."""
    raw = "current" if choice is None else str(choice)
    if raw.lstrip("-").isdigit():
        return sch.known(h, int(raw), url=url)
    if raw not in ("current", "as_of"):
        raise InvalidUsageError(f"option schema={raw!r:.120} is invalid; expected 'current', 'as_of' or a schema id",
                                value=raw[:120])
    return ReadHandle.reader_schema(h, "current" if raw == "current" else "as_of", time)


@dataclass(frozen=True)
class Layout:
    """The reader's schema ``target`` and the schema (by id, ``entries``) each part of a state
    version was written with (``ids``: part key → schema id)."""

    url: str
    target: SchemaEntry
    entries: Mapping[int, SchemaEntry]
    ids: Mapping[str, int]

    @classmethod
    def of(cls, url: str, h: Header, batches: Sequence[BatchMeta], target: SchemaEntry) -> Layout:
        """CorruptionError if a batch names a schema id the state ``h`` does not hold."""
        entries = {e.id: e for e in sch.history(h)}
        for b in batches:
            if b.schema_id not in entries:
                raise CorruptionError(f"batch {b.desc_id} of {url} names schema id {b.schema_id}, which the state "
                                      f"does not hold (it holds {sorted(entries)})")
        return cls(url, target, entries, {p.key: b.schema_id for b in batches for p in b.parts})

    @property
    def schema(self) -> pa.Schema:
        """The reader's user columns."""
        return sch.entry_schema(self.target)

    def source(self, part: PartMeta) -> SchemaEntry:
        """The schema ``part`` was written with."""
        return self.entries[self.ids[part.key]]

    def projected(self, part: PartMeta) -> bool:
        """Whether ``part`` was written under another schema id than the reader's."""
        return self.ids[part.key] != self.target.id

    def lossy(self, part: PartMeta) -> bool:
        """Whether reading ``part`` as the reader's schema leaves out a column it holds (by
        field id: dropped since, or added after the reader's schema)."""
        if not self.projected(part):
            return False
        return not {f.id for f in self.source(part).fields} <= {f.id for f in self.target.fields}

    def schemas(self, parts: Sequence[PartMeta]) -> list[pa.Schema]:
        """The reader's schema and those ``parts`` were written with (each once)."""
        ids = dict.fromkeys([self.target.id, *(self.ids[p.key] for p in parts)])
        return [sch.entry_schema(self.entries[i]) for i in ids]

    def sources(self, parts: Sequence[PartMeta]) -> dict[str, tuple[str | None, ...]]:
        """:attr:`ReadPlan.sources` of ``parts`` (one shared tuple per schema id)."""
        names: dict[int, tuple[str | None, ...]] = {}
        for p in parts:
            if self.projected(p) and self.ids[p.key] not in names:
                names[self.ids[p.key]] = tuple(c.source for c in sch.projection_for(self.source(p), self.target))
        return {p.key: names[self.ids[p.key]] for p in parts if self.projected(p)}


def select_parts(batches: Sequence[BatchMeta], lower: int, upper: int) -> list[PartMeta]:
    """The parts that may hold updates with ``lower <= _time < upper`` (pruned by batch
    bounds and by each part's min/max time)."""
    return [p for b in batches if b.lower < upper for p in b.parts if p.max_time >= lower and p.min_time < upper]


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
    """The parts one Spark task reads."""

    def __init__(self, index: int, parts: tuple[PartMeta, ...]) -> None:
        super().__init__(index)
        self.parts = parts


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
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[InputPartition]:
        groups = group_parts(self.plan.parts, self.plan.partition_bytes, self.plan.min_partitions)
        return [PartGroup(i, g) for i, g in enumerate(groups)] or [PartGroup(0, ())]

    @carry_errors  # runs on executors: a missing part reaches the driver as a CorruptionError record
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        plan = self.plan
        parts: tuple[PartMeta, ...] = getattr(partition, "parts", ())
        if not parts:
            return
        reader = Shard(plan.url).reader()  # retries idempotent reads (shardsink.storage.retry)
        wire = sty.arrow_wire_schema(plan.spark_schema())
        for part in parts:
            f = reader.open_part(part, referenced_by=f"state {plan.seqno}")
            yield from _batches(f, part, plan, wire)


def _batches(f: pq.ParquetFile, part: PartMeta, plan: ReadPlan, wire: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The part's updates within the plan's time bounds, cast to the wire schema."""
    advance = plan.advance_to is not None and part.min_time < plan.advance_to
    filtered = part.min_time < plan.lower or part.max_time >= plan.upper
    # Where each wire column comes from: a projected part's own column names (None: nulls).
    proj = plan.sources.get(part.key)
    names: list[str | None] = list(wire.names) if proj is None else [*proj, *wire.names[len(proj):]]
    read = [n for n in names if n is not None]
    cols = list(dict.fromkeys([*read, TIME])) if filtered else list(dict.fromkeys(read))
    for batch in f.iter_batches(batch_size=plan.batch_rows, columns=cols):
        batch = fl.canonical_batch(batch)  # one float equality with every other path (core/floats.py)
        if advance:  # times below since read as since (they may be stored either way)
            i = batch.schema.get_field_index(TIME)
            batch = batch.set_column(i, batch.schema.field(i),
                                     pc.max_element_wise(batch.column(i), pa.scalar(plan.advance_to, pa.int64())))
        if filtered:
            t = batch.column(TIME)
            batch = batch.filter(pc.and_(pc.greater_equal(t, plan.lower), pc.less(t, plan.upper)))
            if batch.num_rows == 0:
                continue
        try:
            yield pa.RecordBatch.from_arrays([pa.nulls(batch.num_rows, w.type) if n is None else
                                              batch.column(n).cast(w.type) for n, w in zip(names, wire, strict=True)],
                                             schema=wire)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as e:
            raise CorruptionError(f"part {plan.url}/{part.key} does not match the shard schema: {e}") from e


class ShardDataSource(DataSource):
    """The ``shardsink`` format; see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        self.plan = plan_read(self.options)
        return self.plan.spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        plan: ReadPlan | None = getattr(self, "plan", None)
        if plan is None:  # the user passed .schema(...): plan now, and insist it matches
            plan = plan_read(self.options)
            if plan.spark_schema().simpleString() != schema.simpleString():
                raise InvalidUsageError(
                    f"schema {sty.describe(schema)} does not match the shard's {sty.describe(plan.spark_schema())}"
                )
        return ShardReader(plan)


def register(spark: SparkSession) -> None:
    """Make ``format("shardsink")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(ShardDataSource)
