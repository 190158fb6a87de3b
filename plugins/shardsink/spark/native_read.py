"""Native planning of leased reads: ``spark.read.parquet`` of exactly the pinned plan's parts.

The parts, their projections and their time bounds come from the one planner
(:class:`shardsink.core.plan.ReadPlan`); this module only groups them into scans.

Used by :class:`shardsink.spark.read.ShardReads` where Spark reads the shard's store itself
(:func:`native_root`); otherwise the reads go through the Python data source.

**Schema evolution.** Each part is projected onto the reader's schema by field id
(:func:`shardsink.core.schema.projection_for`, the one mapping every reader uses): a renamed
column read by its old name, an added one as a typed ``NULL``, a widened one cast (every
allowed widening casts exactly in Spark too), a dropped one not read. Parts are not read one
scan per schema id: :func:`scan_groups` puts the schema ids whose *physical* columns agree
(a name held means one field id everywhere in the group, compared case-insensitively as
Spark resolves Parquet names, and its types are ones Spark's reader promotes exactly:
``_PROMOTIONS``) into one ``spark.read.parquet`` whose read schema is the union by physical
name at the widest type. A file lacking a name reads it as ``NULL``, so a reader's column is
``coalesce`` of the names its field id has in the group (a part holds at most one of them).
A shard evolved by adds, drops, renames and integer/float widenings is one scan, like one
that never evolved; a case-only rename, a name re-used for a new field id, or a decimal
widening starts another group, joined with ``unionByName`` (no shuffle).

SUBTLE: the time filter is applied right after the scan, and a cast to a type *narrower*
than what is stored (an ``as_of`` reader's older type, reading a part compacted from newer
data) is guarded by the read's time itself, as a caller's predicate may be pushed below
that filter; a value inside the read's time that does not fit fails the job with a
CorruptionError naming the column (as the pyarrow reads do), never Spark's CAST_OVERFLOW.

SUBTLE: a projection that leaves out a column the part holds (dropped since, or added
after the reader's schema) need not keep the part's consolidation: rows that differed only
there become equal. The change feed never skips consolidating such a part
(:func:`consolidation_split`). Adding, renaming and widening map distinct rows to distinct
rows, so those parts keep the skip (``bench/spark_evolved_read.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pyarrow as pa

from shardsink.core.plan import PartRead, ReadPlan
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.spark import datasource as ds
from shardsink.spark import types as sty
from shardsink.spark.diff_sums import raise_record
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

#: How reads are planned: natively where possible, always natively (InvalidUsageError
#: where impossible), or always through the data source.
NativeMode = Literal["auto", "always", "never"]
#: Characters Spark's path handling would read as a glob or URI syntax.
_UNSAFE_PATH = re.compile(r"[*?\[\]{}\\%:,]")


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


def native_root(spark: SparkSession, url: str, schemas: Iterable[pa.Schema], native: NativeMode) -> str | None:
    """Where Spark reads the shard at ``url`` itself (``file://`` or ``s3a://``), or None to
    use the data source; every schema the read touches (the reader's and the parts') must be
    natively readable. InvalidUsageError naming why with ``native="always"``."""
    if native == "never":
        return None
    u = parse_url(url)
    why = None
    if u.scheme == "s3" and native == "auto" and not _has_s3a(spark):
        why = "this Spark has no s3a file system (hadoop-aws)"
    elif _UNSAFE_PATH.search(u.path):
        why = f"the path {u.path!r} has characters Spark would read as a pattern"
    else:
        schemas = list(schemas)
        bad = next((s for s in schemas if not all(natively_readable(f) for f in s)), None)
        twins = next((s for s in schemas if len({n.lower() for n in s.names}) < len(s.names)), None)
        if bad is not None:
            why = f"some column types are not read exactly by Spark's Parquet reader ({bad})"
        elif twins is not None:
            why = f"column names differ only in case, which Spark's Parquet reader does not tell apart ({twins.names})"
    if why is not None:
        if native == "always":
            raise InvalidUsageError(f"cannot read {url} natively: {why}")
        return None
    return f"file://{u.path}" if u.scheme == "file" else f"s3a://{u.bucket}/{u.path}"


def consolidation_split(plan: ReadPlan) -> tuple[list[PartRead], list[PartRead]]:
    """:func:`shardsink.spark.datasource.isolated_parts` of ``plan``'s parts, a part whose
    projection leaves out one of its columns (:attr:`PartRead.drops`) counting as unordered
    (module docstring)."""
    assert plan.lower is not None, "a change feed's plan"
    marked = [msgspec.structs.replace(r.part, order="unordered") if r.drops else r.part for r in plan.parts]
    alone, _ = ds.isolated_parts(marked, plan.lower, plan.upper)
    keys = {p.key for p in alone}
    return [r for r in plan.parts if r.part.key in keys], [r for r in plan.parts if r.part.key not in keys]


#: Spark types a Parquet column of the first type may be read as (Spark 4's Parquet readers,
#: vectorized and row-based, promote these exactly; tests/spark/test_native_evolved.py checks).
_PROMOTIONS = frozenset({("tinyint", "smallint"), ("tinyint", "int"), ("tinyint", "bigint"), ("smallint", "int"),
                         ("smallint", "bigint"), ("int", "bigint"), ("float", "double")})


@dataclass
class ScanGroup:
    """Parts read by one ``spark.read.parquet``: ``columns`` (physical name → the field id
    and the Spark type it is read as: the widest any of the group's parts holds) and, for
    conflict checks, every physical name any part holds (lower-cased → name, field id)."""

    ids: list[int] = field(default_factory=list)
    parts: list[PartRead] = field(default_factory=list)
    columns: dict[str, tuple[int, DataType]] = field(default_factory=dict)
    held: dict[str, tuple[str, int]] = field(default_factory=dict)

    def takes(self, physical: dict[str, tuple[int, DataType]]) -> bool:
        """Whether a schema id holding ``physical`` can share this group's scan: no name it
        holds means another column here (another field id or case; Spark resolves Parquet
        names case-insensitively), and every shared column reads as one Spark type."""
        for name, (fid, t) in physical.items():
            seen = self.held.get(name.lower())
            if seen is None:
                continue
            if seen != (name, fid):
                return False
            have = self.columns[name][1] if name in self.columns else None
            if have is not None and not _promotable(have, t):
                return False
        return True

    def add(self, sid: int, physical: dict[str, tuple[int, DataType]]) -> None:
        self.ids.append(sid)
        for name, (fid, t) in physical.items():
            self.held[name.lower()] = (name, fid)
            have = self.columns.get(name)
            self.columns[name] = (fid, t if have is None or _wider(t, have[1]) else have[1])


def _promotable(a: DataType, b: DataType) -> bool:
    return a == b or (a.simpleString(), b.simpleString()) in _PROMOTIONS or \
        (b.simpleString(), a.simpleString()) in _PROMOTIONS


def _wider(a: DataType, b: DataType) -> bool:
    """Whether every value of ``b`` is exactly an ``a`` (an allowed widening, decimals included)."""
    from pyspark.sql.types import DecimalType

    if isinstance(a, DecimalType) and isinstance(b, DecimalType):
        return a.scale == b.scale and a.precision > b.precision
    return (b.simpleString(), a.simpleString()) in _PROMOTIONS


def scan_groups(plan: ReadPlan, reads: Sequence[PartRead]) -> list[ScanGroup]:
    """``reads`` grouped for as few scans as exactness allows: the parts of schema ids whose
    physical columns agree (same name → same field id, types Spark promotes exactly) share one
    ``spark.read.parquet`` whose read schema is the union by physical name; a column of the
    reader's schema is then the one physical name its part holds for its field id (module
    docstring). Columns the reader's schema leaves out are never read."""
    wanted = {f.id for f in plan.target.fields}
    by_id: dict[int, list[PartRead]] = {}
    for r in reads:
        by_id.setdefault(r.schema_id, []).append(r)
    groups: list[ScanGroup] = []
    for sid in sorted(by_id):
        first = by_id[sid][0]
        held = {f.name: (spec.id, sty.spark_type(f)) for spec, f in zip(first.source.fields, first.written,
                                                                       strict=True)}
        g = next((g for g in groups if g.takes(held)), None)
        if g is None:
            g = ScanGroup()
            groups.append(g)
        g.add(sid, held)
        g.parts.extend(by_id[sid])
    for g in groups:  # read only what the reader's schema shows
        g.columns = {n: c for n, c in g.columns.items() if c[0] in wanted}
    return groups


def scan(spark: SparkSession, plan: ReadPlan, root: str, reads: Sequence[PartRead], *, time: bool) -> DataFrame:
    """``spark.read.parquet`` of exactly ``reads`` (parts of ``plan``): the reader's user columns
    (+ ``_time``) + ``_diff`` for the plan's updates, one scan per :func:`scan_groups` group,
    projected onto the reader's schema by field id (module docstring)."""
    if not reads:
        full = sty.spark_schema(plan.schema, time=True, diff=DIFF)
        return _project(spark.createDataFrame([], full), plan, ScanGroup(), time=time)
    frames = [_project(_read(spark, plan, root, g), plan, g, time=time) for g in scan_groups(plan, reads)]
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _read(spark: SparkSession, plan: ReadPlan, root: str, group: ScanGroup) -> DataFrame:
    """The updates of ``group``'s parts within the plan's times, by physical names."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    parts = [r.part for r in group.parts]
    paths = {f"{root}/{p.key}": p for p in parts}
    read = StructType([*(StructField(n, t, True) for n, (_, t) in group.columns.items()),
                       StructField(TIME, LongType(), False), StructField(DIFF, LongType(), False)])
    try:
        df = spark.read.schema(read).parquet(*paths)
    except AnalysisException as e:
        missing = bare((e.getMessageParameters() or {}).get("path", "")) \
            if e.getCondition() == "PATH_NOT_FOUND" else None
        gone = next((p for path, p in paths.items() if bare(path) == missing), None)
        if gone is not None:
            raise CorruptionError(f"part {plan.url}/{gone.key} is missing (referenced by state {plan.seqno})") from e
        raise
    if any(p.implicit_diffs for p in parts):  # their files store no _diff (read as null): every diff is 1
        df = df.withColumn(DIFF, F.coalesce(F.col(DIFF), F.lit(1).cast("long")))
    cond = _inside(F.col(TIME), plan, group.parts)
    return df if cond is None else df.filter(cond)


def _inside(t: Column, plan: ReadPlan, reads: Sequence[PartRead]) -> Column | None:
    """``lower <= t < upper`` on the sides where one of ``reads`` holds times outside the plan's
    (None: none does)."""
    below, above = any(r.below for r in reads), any(r.above for r in reads)
    if below and plan.lower is not None:
        return (t >= plan.lower) & (t < plan.upper) if above else t >= plan.lower
    return t < plan.upper if above else None


def _project(df: DataFrame, plan: ReadPlan, group: ScanGroup, *, time: bool) -> DataFrame:
    """``df`` (``group``'s physical columns) as the reader's user columns (+ ``_time``) + ``_diff``."""
    from pyspark.sql import functions as F

    tail = [col(n) for n in [*([TIME] if time else []), DIFF]]
    names: dict[int, list[str]] = {}
    for n, (fid, _) in group.columns.items():
        names.setdefault(fid, []).append(n)
    user: list[Column] = []
    for spec, f in zip(plan.target.fields, plan.schema, strict=True):
        want, have = sty.spark_type(f), names.get(spec.id, [])
        if not have:
            user.append(F.lit(None).cast(want).alias(f.name))
            continue
        c = col(have[0]) if len(have) == 1 else F.coalesce(*(col(n) for n in have))
        read = group.columns[have[0]][1]
        if read != want:
            c = c.cast(want) if _wider(want, read) else _narrowed(c, want, plan, spec.id, f, have, group)
        user.append(c.alias(f.name))
    return df.select(*user, *tail)


def _narrowed(c: Column, want: DataType, plan: ReadPlan, fid: int, f: pa.Field, stored: list[str],
              group: ScanGroup) -> Column:
    """``c`` cast to a type it may not fit (an ``as_of`` reader's older, narrower type).

    SUBTLE: a part compacted from newer data may hold values the older type cannot, at times
    outside the read's; the cast is guarded by the read's time itself, not only by the filter
    below it (Spark may evaluate a predicate a caller pushes down on this column before that
    filter). A row inside the read's time whose value does not fit is corruption: the job
    fails with a CorruptionError record naming the column, as :func:`shardsink.core.schema.project`.
    """
    from pyspark.sql import functions as F

    tried = c.try_cast(want)
    inside = _inside(F.col(TIME), plan, group.parts)
    ok = c.isNull() | tried.isNotNull()
    if inside is not None:
        ok = ok | ~inside
    where = " or ".join(repr(n) for n in stored)  # a part holds one of them (renamed between the group's ids)
    msg = F.concat(F.lit(f"shard {plan.url}: column {f.name!r} (field id {fid}, stored as {where}) holds a "
                         f"value that is not a {f.type} under the schema at the read's time: "),
                   c.cast("string"))
    return F.when(ok, tried).otherwise(_corruption(msg, c.cast("string")).cast(want))


def _corruption(message: Column, value: Column) -> Column:
    """A SQL ``raise_error`` carrying a CorruptionError record (:mod:`shardsink.outcome`)."""
    return raise_record("CorruptionError", message, value)


def col(name: str) -> Column:
    """The column ``name`` exactly (quoted: a dot or backtick in a name is not syntax)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


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


def bare(path: str) -> str:
    """A file URL or path without its scheme, leading slashes and %-escapes, for comparing
    the paths Spark reports (``file:/x``, ``file:///x``, ``s3a://b/x``) with ours."""
    from urllib.parse import unquote

    return re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*:/*|^/+", "", unquote(path))
