"""Leased Spark reads of shards: consolidated snapshots and change feeds as DataFrames.

::

    with read_snapshot(spark, url, as_of=T) as df:      # user columns + _count
        df.write.parquet(...)                           # the job runs under the lease

    with ShardReads(spark) as reads:                    # several shards in one job
        a = reads.snapshot(url_a, as_of=T)
        b = reads.changes(url_b, lower, upper)          # + _time, _diff
        a.join(b, ...).collect()

Contracts:

* Frontiers are checked on the driver before any job: ReadFrontierError unless
  ``since <= as_of < upper`` (snapshot) or ``since <= lower <= upper <= shard upper``.
* Each read holds a lease (:mod:`shardsink.core.leases`) at its ``as_of`` (changes: at
  ``lower``) from the call until the ``with`` block ends; a daemon thread renews it. A
  lease lost on the way raises LeaseLostError at the end of the block; a crashed
  driver's lease expires after its TTL.
* DataFrames are lazy: run every action *inside* the block. An action after it runs
  without protection (and may fail if maintenance removed parts meanwhile).
* ``snapshot`` equals :meth:`Shard.snapshot`: one row per distinct row with its
  multiplicity ``_count > 0`` (or, with ``repeat=True``, each row ``_count`` times and no
  ``_count``). A negative sum fails the job; leaving the block turns that failure
  (and a missing/unreadable part) into CorruptionError.
* ``changes`` equals :meth:`Shard.changes`: consolidated per ``(row, _time)``.

HAZARD: Spark's grouping normalises NaN and -0.0 in float columns; rows differing
only there are merged where pyarrow would keep them apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from shardsink.core import parts as pt
from shardsink.core.leases import DEFAULT_TTL_S, LeaseKeeper
from shardsink.core.shard import Shard, default_writer
from shardsink.errors import InvalidUsageError, ReadFrontierError, ShardsinkError
from shardsink.outcome import MARK, ErrorClass, error_from_record, record_of
from shardsink.spark import datasource as ds

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession



class ShardReads:
    """Leased reads for one job; a context manager (leases released on exit)."""

    def __init__(self, spark: SparkSession, *, holder: str | None = None, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.spark = spark
        self.holder = holder or f"spark-read@{default_writer()}"
        self.keeper = LeaseKeeper(ttl_s=ttl_s)
        self._open = False

    def __enter__(self) -> ShardReads:
        ds.register(self.spark)
        self._open = True
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._open = False
        try:
            self.keeper.close()
        finally:
            if e is not None and not isinstance(e, ShardsinkError):
                # A typed record raised inside the job (executor code or a SQL raise_error):
                # surface the same shardsink error the code raised (see shardsink.outcome).
                err = error_from_record(record_of(e))
                if err is not None:
                    raise err from e

    def _shard(self, url: str) -> Shard:
        if not self._open:
            raise InvalidUsageError("ShardReads is not open: use it as a context manager (with ShardReads(...))")
        return Shard.open(url)

    def _reader(self) -> DataFrameReader:
        try:
            spread = int(self.spark.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext
            spread = 1
        return self.spark.read.format(ds.NAME).option("minPartitions", str(spread))

    def updates(self, url: str, as_of: int | None = None) -> DataFrame:
        """Leased raw snapshot updates (user columns + ``_diff``, unconsolidated; see datasource)."""
        return self._updates(url, as_of)[0]

    def _updates(self, url: str, as_of: int | None) -> tuple[DataFrame, int]:
        shard = self._shard(url)
        h = shard.machine.head().version.header
        if as_of is None:
            if h.upper is None:
                raise ReadFrontierError(f"shard {shard.url} is closed; pass an explicit as_of")
            as_of = h.upper - 1
        ds.check_as_of(shard.url, h, as_of)
        self.keeper.acquire(shard, as_of, holder=self.holder)
        reader = self._reader().option("as_of", str(as_of))
        return reader.load(shard.url), as_of

    def snapshot(self, url: str, as_of: int | None = None, *, repeat: bool = False) -> DataFrame:
        """The consolidated contents as of ``as_of`` (default upper - 1); see the module docstring."""
        from pyspark.sql import functions as F

        raw, resolved = self._updates(url, as_of)
        cols = [c for c in raw.columns if c != pt.DIFF]
        where = f"shard {url} as of {resolved}"
        summed = raw.groupBy(*cols).agg(F.sum(pt.DIFF).alias(pt.COUNT))
        out = summed.select(*cols, _checked_count(cols, where).alias(pt.COUNT)).filter(F.col(pt.COUNT) > 0)
        if not repeat:
            return out
        ones = F.array_repeat(F.lit(True), F.col(pt.COUNT).cast("int"))
        return out.withColumn("__one", F.explode(ones)).select(*cols)

    def changes(self, url: str, lower: int, upper: int, *, consolidate: bool = True) -> DataFrame:
        """Updates with ``lower <= _time < upper`` (user columns + ``_time`` + ``_diff``)."""
        from pyspark.sql import functions as F

        shard = self._shard(url)
        ds.check_changes(shard.url, shard.machine.head().version.header, lower, upper)
        self.keeper.acquire(shard, lower, holder=self.holder)
        reader = self._reader().option("mode", "changes").option("from", str(lower)).option("to", str(upper))
        raw = reader.load(shard.url)
        if not consolidate:
            return raw
        keys = [c for c in raw.columns if c != pt.DIFF]
        summed = raw.groupBy(*keys).agg(F.sum(pt.DIFF).alias(pt.DIFF))
        return summed.filter(F.col(pt.DIFF) != 0).select(*keys, pt.DIFF)


def _checked_count(cols: list[str], where: str) -> Column:
    """``_count``, or a job failure (a CorruptionError record) naming the row if it is negative."""
    from pyspark.sql import functions as F

    c = F.col(pt.COUNT)
    row = F.to_json(F.struct(*cols))
    msg = F.concat(F.lit(f"{where}: negative multiplicity "), c.cast("string"), F.lit(" for row "), row)
    return F.when(c < 0, raise_record("CorruptionError", msg, row)).otherwise(c)


def raise_record(error_class: ErrorClass, message: Column, value: Column) -> Column:
    """A SQL ``raise_error`` whose text is a typed error record (:mod:`shardsink.outcome`).

    The record is built by ``to_json`` (proper escaping of any row value), so the driver
    decodes it exactly instead of matching the message.
    """
    from pyspark.sql import functions as F

    record = F.to_json(F.struct(F.lit(error_class).alias("error_class"), F.lit(error_class).alias("raised"),
                                message.alias("message"), value.alias("value")))
    return F.raise_error(F.concat(F.lit(MARK), record))


@contextmanager
def read_snapshot(spark: SparkSession, url: str, as_of: int | None = None, *, repeat: bool = False,
                  holder: str | None = None) -> Iterator[DataFrame]:
    """A leased consolidated snapshot (see :class:`ShardReads`); run actions inside the block."""
    with ShardReads(spark, holder=holder) as reads:
        yield reads.snapshot(url, as_of, repeat=repeat)


@contextmanager
def read_changes(spark: SparkSession, url: str, lower: int, upper: int, *,
                 holder: str | None = None) -> Iterator[DataFrame]:
    """A leased, consolidated change feed ``[lower, upper)``; run actions inside the block."""
    with ShardReads(spark, holder=holder) as reads:
        yield reads.changes(url, lower, upper)
