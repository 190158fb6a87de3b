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

**Native reads.** Where Spark can read the shard's store itself (a local folder; ``s3a``
when the cluster has hadoop-aws: ``native="auto"``) and every column has a type Spark's
Parquet reader maps exactly, the helpers plan ``spark.read.parquet`` of exactly the parts
the pinned state version lists (pruned by batch bounds and each part's min/max time),
with the time filter and the ``_diff`` handling in Spark; otherwise they read through the
Python data source (:mod:`shardsink.spark.datasource`). ``native="never"`` forces the
data source, ``"always"`` refuses the fallback. Both give the same rows. ``changes``
skips the global consolidation for sorted parts whose time ranges overlap no other part's
(a sorted part is consolidated on its own; an unordered one is always consolidated),
which is every sorted part of a shard written one task per batch.

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
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

import pyarrow as pa

from shardsink.core.leases import DEFAULT_TTL_S, LeaseKeeper
from shardsink.core.shard import Shard, default_writer
from shardsink.core.state import PartMeta, Version
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.errors import CorruptionError, InvalidUsageError, ReadFrontierError, ShardsinkError
from shardsink.outcome import MARK, ErrorClass, error_from_record, record_of
from shardsink.spark import datasource as ds
from shardsink.spark import types as sty
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession

#: How reads are planned: natively where possible (see the module docstring), always
#: natively (InvalidUsageError where impossible), or always through the data source.
NativeMode = Literal["auto", "always", "never"]
#: Characters Spark's path handling would read as a glob or URI syntax.
_UNSAFE_PATH = re.compile(r"[*?\[\]{}\\%:,]")
#: Spark's error conditions (``PySparkException.getCondition``) for a file that vanished
#: (at planning or in a task) or cannot be decoded; their ``path`` parameter names the file.
_FILE_FAILURES = frozenset({"PATH_NOT_FOUND", "FAILED_READ_FILE.FILE_NOT_EXIST", "FAILED_READ_FILE.NO_HINT",
                            "FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER",
                            "FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH"})


def natively_readable(field: pa.Field) -> bool:
    """Whether Spark's Parquet reader maps this column to exactly the type the data source gives."""
    t = field.type
    if pa.types.is_timestamp(t):
        return t.tz is not None and t.unit in ("ms", "us")
    return (
        (pa.types.is_integer(t) and pa.types.is_signed_integer(t))
        or pa.types.is_float32(t) or pa.types.is_float64(t) or pa.types.is_boolean(t)
        or t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.date32())
        or pa.types.is_decimal128(t)
    )


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

    def updates(self, url: str, as_of: int | None = None, *, at: Version | None = None) -> DataFrame:
        """Leased raw snapshot updates (user columns + ``_diff``, unconsolidated; see datasource).

        ``at``: a state version of ``url`` the caller already read, for the frontier check and
        the schema (else one head read); the parts always come from a version read after the
        lease is held (:mod:`shardsink.core.leases`)."""
        return self._updates(url, as_of, at=at)[0]

    def _updates(self, url: str, as_of: int | None, *, at: Version | None = None) -> tuple[DataFrame, int]:
        shard = self._shard(url)
        v = at if at is not None else shard.reader().head()
        h = v.header
        if as_of is None:
            if h.upper is None:
                raise ReadFrontierError(f"shard {shard.url} is closed; pass an explicit as_of")
            as_of = h.upper - 1
        ds.check_as_of(shard.url, h, as_of)
        pinned = self.keeper.acquire_pinned(shard, as_of, holder=self.holder, head=v)[1]
        root = self._native_root(shard, h.schema)
        if root is not None:
            parts, seqno = self._pinned_parts(shard, pinned, ds.MIN_TIME, as_of + 1)
            return self._scan(shard, root, h.schema, parts, seqno, ds.MIN_TIME, as_of + 1, time=False), as_of
        reader = self._reader().option("as_of", str(as_of))
        return reader.load(shard.url), as_of

    # --- native planning ----------------------------------------------------------

    def _native_root(self, shard: Shard, schema: pa.Schema) -> str | None:
        """Where Spark reads this shard's objects itself, or None to use the data source."""
        if self.native == "never":
            return None
        u = parse_url(shard.url)
        why = None
        if u.scheme == "s3" and self.native == "auto" and not _has_s3a(self.spark):
            why = "this Spark has no s3a file system (hadoop-aws)"
        elif _UNSAFE_PATH.search(u.path):
            why = f"the path {u.path!r} has characters Spark would read as a pattern"
        elif not all(natively_readable(f) for f in schema):
            why = f"some column types are not read exactly by Spark's Parquet reader ({schema})"
        if why is not None:
            if self.native == "always":
                raise InvalidUsageError(f"cannot read {shard.url} natively: {why}")
            return None
        root = f"file://{u.path}" if u.scheme == "file" else f"s3a://{u.bucket}/{u.path}"
        if root not in self._roots:
            self._roots.append(root)
        return root

    def _pinned_parts(self, shard: Shard, v: Version, lower: int, upper: int) -> tuple[list[PartMeta], int]:
        """The parts of ``v`` (the lease's re-check version, read after the lease is held) for ``[lower, upper)``."""
        return ds.select_parts(shard.reader().batches(v), lower, upper), v.seqno

    def _scan(self, shard: Shard, root: str, schema: pa.Schema, parts: Sequence[PartMeta], seqno: int,
              lower: int, upper: int, *, time: bool) -> DataFrame:
        """``spark.read.parquet`` of exactly ``parts``: user columns (+ ``_time``) + ``_diff``
        for the updates with ``lower <= _time < upper``."""
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        full = sty.spark_schema(schema, time=True, diff=DIFF)
        cols = [*schema.names, *([TIME] if time else []), DIFF]
        if not parts:
            return self.spark.createDataFrame([], full).select(*cols)
        paths = {f"{root}/{p.key}": p for p in parts}
        try:
            df = self.spark.read.schema(full).parquet(*paths)
        except AnalysisException as e:
            missing = _bare((e.getMessageParameters() or {}).get("path", "")) \
                if e.getCondition() == "PATH_NOT_FOUND" else None
            gone = next((p for path, p in paths.items() if _bare(path) == missing), None)
            if gone is not None:
                raise CorruptionError(f"part {shard.url}/{gone.key} is missing (referenced by state {seqno})") from e
            raise
        t = F.col(TIME)
        if any(p.min_time < lower for p in parts) and any(p.max_time >= upper for p in parts):
            df = df.filter((t >= lower) & (t < upper))
        elif any(p.min_time < lower for p in parts):
            df = df.filter(t >= lower)
        elif any(p.max_time >= upper for p in parts):
            df = df.filter(t < upper)
        return df.select(*cols)

    def snapshot(self, url: str, as_of: int | None = None, *, repeat: bool = False,
                 at: Version | None = None) -> DataFrame:
        """The consolidated contents as of ``as_of`` (default upper - 1); see the module docstring.
        ``at``: as for :meth:`updates`."""
        from pyspark.sql import functions as F

        raw, resolved = self._updates(url, as_of, at=at)
        cols = [c for c in raw.columns if c != DIFF]
        where = f"shard {url} as of {resolved}"
        summed = raw.groupBy(*cols).agg(F.sum(DIFF).alias(COUNT))
        out = summed.select(*cols, _checked_count(cols, where).alias(COUNT)).filter(F.col(COUNT) > 0)
        if not repeat:
            return out
        ones = F.array_repeat(F.lit(True), F.col(COUNT).cast("int"))
        return out.withColumn("__one", F.explode(ones)).select(*cols)

    def changes(self, url: str, lower: int, upper: int, *, consolidate: bool = True,
                at: Version | None = None) -> DataFrame:
        """Updates with ``lower <= _time < upper`` (user columns + ``_time`` + ``_diff``).
        ``at``: as for :meth:`updates`."""
        shard = self._shard(url)
        v = at if at is not None else shard.reader().head()
        h = v.header
        ds.check_changes(shard.url, h, lower, upper)
        pinned = self.keeper.acquire_pinned(shard, lower, holder=self.holder, head=v)[1]
        root = self._native_root(shard, h.schema)
        if root is not None:
            parts, seqno = self._pinned_parts(shard, pinned, ds.MIN_TIME if lower <= h.since else lower, upper)
            if lower <= h.since and any(p.min_time < h.since for p in parts):
                # SUBTLE: times below since are read as since (compaction may have advanced
                # them): the data source implements that; the native scan does not.
                root = None
            else:
                parts = [p for p in parts if p.max_time >= lower]
        if root is not None:
            if not consolidate:
                return self._scan(shard, root, h.schema, parts, seqno, lower, upper, time=True)
            alone, shared = ds.isolated_parts(parts, lower, upper)
            out = self._scan(shard, root, h.schema, alone, seqno, lower, upper, time=True)
            if shared:
                out = out.unionByName(_consolidated(self._scan(shard, root, h.schema, shared, seqno, lower, upper,
                                                               time=True)))
            return out
        reader = self._reader().option("mode", "changes").option("from", str(lower)).option("to", str(upper))
        raw = reader.load(shard.url)
        if not consolidate:
            return raw
        return _consolidated(raw)


def _consolidated(raw: DataFrame) -> DataFrame:
    """Updates summed per ``(row, _time)``, zero sums dropped (columns kept in order)."""
    from pyspark.sql import functions as F

    keys = [c for c in raw.columns if c != DIFF]
    summed = raw.groupBy(*keys).agg(F.sum(DIFF).alias(DIFF))
    return summed.filter(F.col(DIFF) != 0).select(*keys, DIFF)


_S3A: dict[int, bool] = {}


def _has_s3a(spark: SparkSession) -> bool:
    """Whether the driver's JVM has hadoop-aws (Spark Connect: unknown, so no)."""
    key = id(spark)
    if key not in _S3A:
        try:
            jvm: Any = spark.sparkContext._jvm
            jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
            _S3A[key] = True
        except Exception:
            _S3A[key] = False
    return _S3A[key]


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
        bare = re.escape(_bare(root).rstrip("/"))
        for path in paths:
            m = re.search(rf"(?:^|[\s/]){bare}/(parts/[^\s'\"`\]]+?\.parquet)", _bare(path))
            if m:
                return f"{root}/{m.group(1)}"
    return None


def _bare(path: str) -> str:
    """A file URL or path without its scheme, leading slashes and %-escapes, for comparing
    the paths Spark reports (``file:/x``, ``file:///x``, ``s3a://b/x``) with ours."""
    return re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*:/*|^/+", "", unquote(path))


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


def _checked_count(cols: list[str], where: str) -> Column:
    """``_count``, or a job failure (a CorruptionError record) naming the row if it is negative."""
    from pyspark.sql import functions as F

    c = F.col(COUNT)
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
