"""Native planning of leased reads: ``spark.read.parquet`` of exactly the pinned parts.

Used by :class:`shardsink.spark.read.ShardReads` where Spark reads the shard's store itself
(:func:`native_root`); otherwise the reads go through the Python data source.

**Schema evolution.** Parts are grouped by the schema id their batch was written with
(:class:`shardsink.spark.datasource.Layout`); each group is one ``spark.read.parquet`` with
*that* schema (the part files' own names and types, so Spark never guesses a widening or
a missing column), then projected onto the reader's schema by field id
(:func:`shardsink.core.schema.projection_for`, the one mapping every reader uses): a renamed
column read by its old name and aliased, an added one as a typed ``NULL``, a widened one
cast (every allowed widening casts exactly in Spark too), a dropped one not selected. The
groups are joined with ``unionByName``: one more scan per schema id, no shuffle.

SUBTLE: a projection that leaves out a column the part holds (dropped since, or added
after the reader's schema) need not keep the part's consolidation: rows that differed only
there become equal. The change feed never skips consolidating such a part
(:func:`consolidation_split`). Adding, renaming and widening map distinct rows to distinct
rows, so those parts keep the skip: reading a shard that only grew costs one more scan per
schema id (``bench/spark_evolved_read.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pyarrow as pa

from shardsink.core import schema as sch
from shardsink.core.state import PartMeta, SchemaEntry
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import CorruptionError, InvalidUsageError
from shardsink.spark import datasource as ds
from shardsink.spark import types as sty
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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
        bad = next((s for s in schemas if not all(natively_readable(f) for f in s)), None)
        if bad is not None:
            why = f"some column types are not read exactly by Spark's Parquet reader ({bad})"
    if why is not None:
        if native == "always":
            raise InvalidUsageError(f"cannot read {url} natively: {why}")
        return None
    return f"file://{u.path}" if u.scheme == "file" else f"s3a://{u.bucket}/{u.path}"


def consolidation_split(layout: ds.Layout, parts: Sequence[PartMeta], lower: int,
                        upper: int) -> tuple[list[PartMeta], list[PartMeta]]:
    """:func:`shardsink.spark.datasource.isolated_parts`, a part whose projection leaves out one
    of its columns counting as unordered (module docstring)."""
    marked = [msgspec.structs.replace(p, order="unordered") if layout.lossy(p) else p for p in parts]
    alone, shared = ds.isolated_parts(marked, lower, upper)
    by_key = {p.key: p for p in parts}
    return [by_key[p.key] for p in alone], [by_key[p.key] for p in shared]


def scan(spark: SparkSession, layout: ds.Layout, root: str, parts: Sequence[PartMeta], seqno: int, lower: int,
         upper: int, *, time: bool) -> DataFrame:
    """``spark.read.parquet`` of exactly ``parts``: the reader's user columns (+ ``_time``) +
    ``_diff`` for the updates with ``lower <= _time < upper``, each schema id's parts read with
    their own schema and projected (module docstring)."""
    groups: dict[int, list[PartMeta]] = {}
    for p in parts:
        groups.setdefault(layout.ids[p.key], []).append(p)
    if not groups:
        full = sty.spark_schema(layout.schema, time=True, diff=DIFF)
        return _project(spark.createDataFrame([], full), layout.target, layout.target, time=time)
    frames = [_project(_read(spark, layout, root, layout.entries[i], g, seqno, lower, upper), layout.entries[i],
                       layout.target, time=time) for i, g in groups.items()]
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _read(spark: SparkSession, layout: ds.Layout, root: str, source: SchemaEntry, parts: Sequence[PartMeta],
          seqno: int, lower: int, upper: int) -> DataFrame:
    """The updates of ``parts`` (all written under ``source``) with ``lower <= _time < upper``,
    by the parts' own column names and types."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    paths = {f"{root}/{p.key}": p for p in parts}
    try:
        df = spark.read.schema(sty.spark_schema(sch.entry_schema(source), time=True, diff=DIFF)).parquet(*paths)
    except AnalysisException as e:
        missing = bare((e.getMessageParameters() or {}).get("path", "")) \
            if e.getCondition() == "PATH_NOT_FOUND" else None
        gone = next((p for path, p in paths.items() if bare(path) == missing), None)
        if gone is not None:
            raise CorruptionError(f"part {layout.url}/{gone.key} is missing (referenced by state {seqno})") from e
        raise
    t = F.col(TIME)
    below, above = any(p.min_time < lower for p in parts), any(p.max_time >= upper for p in parts)
    if below and above:
        return df.filter((t >= lower) & (t < upper))
    if below:
        return df.filter(t >= lower)
    return df.filter(t < upper) if above else df


def _project(df: DataFrame, source: SchemaEntry, target: SchemaEntry, *, time: bool) -> DataFrame:
    """``df`` (a part's columns by ``source``'s names) as ``target``'s user columns (+ ``_time``) + ``_diff``."""
    from pyspark.sql import functions as F

    tail = [col(n) for n in [*([TIME] if time else []), DIFF]]
    if source.id == target.id:
        return df.select(*(col(n) for n in sch.entry_schema(target).names), *tail)
    user: list[Column] = []
    for c, f in zip(sch.projection_for(source, target), sch.entry_schema(target), strict=True):
        want = sty.spark_type(f)
        if c.source is None:
            user.append(F.lit(None).cast(want).alias(c.name))
        else:
            user.append(col(c.source).cast(want).alias(c.name))
    return df.select(*user, *tail)


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
