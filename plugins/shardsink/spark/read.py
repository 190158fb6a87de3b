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
* Every ``_diff`` sum is exact (:mod:`shardsink.spark.diff_sums`): an overflow on the way that
  ends inside int64 reads exactly, a sum outside int64 is CorruptionError naming the row (as
  the pyarrow reads); the plain ``bigint`` sum only where the parts' ``_diff`` statistics
  prove no sum can leave int64 (a local folder read natively). Column names are quoted
  (a dot or space in a name is not syntax).

**Native reads.** Where Spark can read the shard's store itself (a local folder; ``s3a``
when the cluster has hadoop-aws: ``native="auto"``) and every column has a type Spark's
Parquet reader maps exactly, the helpers plan ``spark.read.parquet`` of exactly the parts
the one planner (:mod:`shardsink.core.plan`) picks on the pinned state version, with the
time filter and the ``_diff`` handling in Spark; otherwise they read through the Python
data source (:mod:`shardsink.spark.datasource`), which plans the same read on the same
version (:func:`~shardsink.spark.datasource.source_options`). ``native="never"`` forces the
data source, ``"always"`` refuses the fallback. Both give the same rows. ``changes``
skips the global consolidation for sorted parts whose time ranges overlap no other part's
(a sorted part is consolidated on its own; an unordered one is always consolidated),
which is every sorted part of a shard written one task per batch.

**Schema evolution.** Every read has the columns of the reader's schema (``schema=
"current"``, default, or ``"as_of"``: as :meth:`Shard.snapshot` / :meth:`Shard.changes`),
each part projected by field id from the schema id it was written with, on both paths:
the data source per part (:mod:`shardsink.spark.datasource`), a native read per group of
parts whose physical columns one Parquet scan can read exactly (usually one scan for every
schema id), then ``unionByName`` (:mod:`shardsink.spark.native_read`).
Views, corrections and re-processing read through these helpers, so they project too.

HAZARD: Spark's grouping normalises NaN and -0.0 in float columns; rows differing
only there are merged where pyarrow would keep them apart. A native read does not
compare a part's row count with the state (the data source does); a missing or
unreadable part still fails the read with CorruptionError.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from shardsink.core import plan as pl
from shardsink.core.leases import DEFAULT_TTL_S, LeaseKeeper
from shardsink.core.plan import ReadPlan, SchemaChoice
from shardsink.core.shard import Shard, default_writer
from shardsink.core.state import Version
from shardsink.core.updates import COUNT, DIFF
from shardsink.errors import CorruptionError, InvalidUsageError, ShardsinkError
from shardsink.outcome import error_from_record, record_of
from shardsink.spark import datasource as ds
from shardsink.spark import diff_sums as sums
from shardsink.spark import native_read as nr
from shardsink.spark.diff_sums import raise_record
from shardsink.spark.native_read import NativeMode, natively_readable

__all__ = ["NativeMode", "ShardReads", "natively_readable", "raise_record", "read_changes", "read_snapshot"]

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession

#: The most repetitions of one row ``snapshot(repeat=True)`` emits (Java's array limit).
_MAX_REPEAT = 2**31 - 16
#: Spark's error conditions (``PySparkException.getCondition``) for a file that vanished
#: (at planning or in a task) or cannot be decoded; their ``path`` parameter names the file.
_FILE_FAILURES = frozenset({"PATH_NOT_FOUND", "FAILED_READ_FILE.FILE_NOT_EXIST", "FAILED_READ_FILE.NO_HINT",
                            "FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER",
                            "FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH"})


class ShardReads:
    """Leased reads for one job; a context manager (leases released on exit)."""

    def __init__(self, spark: SparkSession, *, holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
                 native: NativeMode = "auto") -> None:
        if native not in ("auto", "always", "never"):
            raise InvalidUsageError(f"native={native!r} is invalid; expected 'auto', 'always' or 'never'")
        self.spark = spark
        self.holder = holder or f"spark-read@{default_writer()}"
        self.keeper = LeaseKeeper(ttl_s=ttl_s)
        self.native = native
        self._open = False
        self._roots: list[str] = []  # stores read natively: their file failures are corruption

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
                part = _failed_part(e, self._roots)
                if part is not None:
                    raise CorruptionError(f"part {part} is missing or unreadable: {_first_line(e)}") from e

    def _shard(self, url: str) -> Shard:
        """A handle on ``url`` (no read: the read's own head read raises ShardNotFoundError)."""
        if not self._open:
            raise InvalidUsageError("ShardReads is not open: use it as a context manager (with ShardReads(...))")
        return Shard(url)

    def _reader(self) -> DataFrameReader:
        try:
            spread = int(self.spark.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext
            spread = 1
        return self.spark.read.format(ds.NAME).option("minPartitions", str(spread))

    def updates(self, url: str, as_of: int | None = None, *, at: Version | None = None,
                schema: SchemaChoice = "current") -> DataFrame:
        """Leased raw snapshot updates (user columns + ``_diff``, unconsolidated; see datasource).

        ``at``: a state version of ``url`` the caller already read, for the frontier check and
        the reader's schema (else one head read); the parts always come from a version read
        after the lease is held (:mod:`shardsink.core.leases`). ``schema``: the columns of the
        current schema, or (``"as_of"``) of the one current at ``as_of`` (as :meth:`Shard.snapshot`)."""
        return self._updates(url, as_of, at=at, schema=schema)[0]

    def _updates(self, url: str, as_of: int | None, *, at: Version | None = None,
                 schema: SchemaChoice = "current") -> tuple[DataFrame, int, bool]:
        """The raw updates, the resolved ``as_of``, and whether their sums need the exact
        (decimal) aggregate (:func:`shardsink.spark.diff_sums.parts_may_overflow`)."""
        shard, pinned = self._pin(url, at, as_of=as_of, schema=schema)
        as_of = pinned.bounds.as_of
        native = self._native(shard, pinned)
        if native is not None:
            plan, root = native
            scan = nr.scan(self.spark, plan, root, plan.parts, time=False)
            return scan, as_of, sums.parts_may_overflow(root, [r.part for r in plan.parts])
        return self._source(shard, pinned), as_of, True

    def _pin(self, url: str, at: Version | None, *, as_of: int | None = None,
             changes: tuple[int, int] | None = None, schema: SchemaChoice) -> tuple[Shard, pl.Pinned]:
        """The read leased and pinned (:func:`shardsink.core.plan.pin`): bounds and reader schema
        from ``at`` (else one head read), parts from the version read after the lease."""
        shard = self._shard(url)
        head = at if at is not None else shard.reader().head()
        return shard, pl.pin(shard, self.keeper, head, holder=self.holder, as_of=as_of, changes=changes,
                             schema=pl.check_schema_choice(schema))

    def _source(self, shard: Shard, pinned: pl.Pinned) -> DataFrame:
        """The data source's read of ``pinned`` (the same plan, made in the source's worker)."""
        return self._reader().options(**ds.source_options(pinned)).load(shard.url)

    def _native(self, shard: Shard, pinned: pl.Pinned) -> tuple[ReadPlan, str] | None:
        """For a native read (:func:`shardsink.spark.native_read.native_root`; None: use the data
        source): the plan of ``pinned`` and the root Spark reads its parts under. The parts are
        listed only when the store itself can be read natively."""
        if nr.native_root(self.spark, shard.url, (), self.native) is None:
            return None
        plan = pl.plan_pinned(shard, pinned)
        root = nr.native_root(self.spark, shard.url, plan.schemas(), self.native)
        if root is None:
            return None
        if root not in self._roots:
            self._roots.append(root)
        return plan, root

    def snapshot(self, url: str, as_of: int | None = None, *, repeat: bool = False,
                 at: Version | None = None, schema: SchemaChoice = "current") -> DataFrame:
        """The consolidated contents as of ``as_of`` (default upper - 1); see the module docstring.
        ``at``, ``schema``: as for :meth:`updates`."""
        from pyspark.sql import functions as F

        raw, resolved, exact = self._updates(url, as_of, at=at, schema=schema)
        cols = [c for c in raw.columns if c != DIFF]
        where = f"shard {url} as of {resolved}"
        summed = sums.summed(raw, cols, COUNT, exact=exact)
        count = sums.checked_sum(COUNT, cols, where, negative=True)
        out = summed.select(*sums.cols(cols), count.alias(COUNT)).filter(sums.col(COUNT) > 0)
        if not repeat:
            return out
        return out.withColumn("__one", F.explode(_repeats(cols, where))).select(*sums.cols(cols))

    def changes(self, url: str, lower: int, upper: int, *, consolidate: bool = True,
                at: Version | None = None, schema: SchemaChoice = "current") -> DataFrame:
        """Updates with ``lower <= _time < upper`` (user columns + ``_time`` + ``_diff``).
        ``at``: as for :meth:`updates`; ``schema``: ``"as_of"`` is the one current at ``upper - 1``
        (as :meth:`Shard.changes`)."""
        shard, pinned = self._pin(url, at, changes=(lower, upper), schema=schema)
        where = f"shard {shard.url} changes [{lower}, {upper})"
        native = self._native(shard, pinned)
        if native is not None and native[0].advance:
            # SUBTLE: times below since are read as since (compaction may have advanced
            # them): the data source implements that; the native scan does not.
            native = None
        if native is not None:
            plan, root = native
            if not consolidate:
                return nr.scan(self.spark, plan, root, plan.parts, time=True)
            alone, shared = nr.consolidation_split(plan)
            out = nr.scan(self.spark, plan, root, alone, time=True)
            if shared:
                scan = nr.scan(self.spark, plan, root, shared, time=True)
                exact = sums.parts_may_overflow(root, [r.part for r in shared])
                out = out.unionByName(_consolidated(scan, where, exact=exact))
            return out
        raw = self._source(shard, pinned)
        if not consolidate:
            return raw
        return _consolidated(raw, where, exact=True)


def _consolidated(raw: DataFrame, where: str, *, exact: bool) -> DataFrame:
    """Updates summed per ``(row, _time)`` (exactly: :mod:`shardsink.spark.diff_sums`), zero sums
    dropped (columns kept in order); a sum outside int64 fails the job (CorruptionError record)."""
    keys = [c for c in raw.columns if c != DIFF]
    summed = sums.summed(raw, keys, DIFF, exact=exact)
    out = summed.select(*sums.cols(keys), sums.checked_sum(DIFF, keys, where).alias(DIFF))
    return out.filter(sums.col(DIFF) != 0)


def _repeats(cols: list[str], where: str) -> Column:
    """``_count`` ``True`` values (a row's repetitions); a job failure (InvalidUsageError record)
    naming the row if ``_count`` exceeds what one Spark array holds."""
    from pyspark.sql import functions as F

    c, row = sums.col(COUNT), F.to_json(F.struct(*sums.cols(cols)))
    too_many = raise_record("InvalidUsageError", F.concat(
        F.lit(f"{where}: cannot repeat a row "), c.cast("string"), F.lit(" times (repeat=True) for row "), row), row)
    n = F.when(c > F.lit(_MAX_REPEAT), too_many).otherwise(c).cast("int")
    return F.array_repeat(F.lit(True), n)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _failed_part(e: BaseException, roots: Sequence[str]) -> str | None:
    """The part a native read failed on (a vanished or undecodable file under a root), or None.

    Classified by Spark's error condition and its ``path`` parameter, never by message text,
    except for a failure that carries no condition at all (a bare ``java.io.FileNotFoundException``
    that Spark did not wrap): only then is the text searched, as Spark gives nothing else.
    """
    if not roots:
        return None
    conditions = _spark_conditions(e)
    if conditions:
        paths = [params.get("path", "") for cond, params in conditions if cond in _FILE_FAILURES]
    else:  # text fallback: Spark gave no error condition
        paths = [str(e)] if "FileNotFoundException" in str(e) else []
    for root in roots:
        bare = re.escape(nr.bare(root).rstrip("/"))
        for path in paths:
            m = re.search(rf"(?:^|[\s/]){bare}/(parts/[^\s'\"`\]]+?\.parquet)", nr.bare(path))
            if m:
                return f"{root}/{m.group(1)}"
    return None


def _spark_conditions(e: BaseException) -> list[tuple[str, dict[str, str]]]:
    """Spark's error conditions and message parameters on ``e`` and its causes: PySpark's own
    exceptions (classic and Connect), and the JVM's ``SparkThrowable`` chain of a failure PySpark
    left unconverted (a task's failure reaches the driver as a ``Py4JJavaError``)."""
    from pyspark.errors import PySparkException

    out: list[tuple[str, dict[str, str]]] = []
    x: BaseException | None = e
    seen: set[int] = set()
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, PySparkException) and x.getCondition():
            out.append((str(x.getCondition()), dict(x.getMessageParameters() or {})))
        j: Any = getattr(x, "java_exception", None)
        for _ in range(16):  # a JVM cause chain may loop
            if j is not None and _is_spark_throwable(j) and j.getCondition():
                out.append((str(j.getCondition()), {str(k): str(v) for k, v in j.getMessageParameters().items()}))
            j = None if j is None else j.getCause()
        x = x.__cause__
    return out


def _is_spark_throwable(j: Any) -> bool:
    from py4j.java_gateway import is_instance_of
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    return gateway is not None and bool(is_instance_of(gateway, j, "org.apache.spark.SparkThrowable"))


@contextmanager
def read_snapshot(spark: SparkSession, url: str, as_of: int | None = None, *, repeat: bool = False,
                  holder: str | None = None, native: NativeMode = "auto") -> Iterator[DataFrame]:
    """A leased consolidated snapshot (see :class:`ShardReads`); run actions inside the block."""
    with ShardReads(spark, holder=holder, native=native) as reads:
        yield reads.snapshot(url, as_of, repeat=repeat)


@contextmanager
def read_changes(spark: SparkSession, url: str, lower: int, upper: int, *, holder: str | None = None,
                 native: NativeMode = "auto") -> Iterator[DataFrame]:
    """A leased, consolidated change feed ``[lower, upper)``; run actions inside the block."""
    with ShardReads(spark, holder=holder, native=native) as reads:
        yield reads.changes(url, lower, upper)
