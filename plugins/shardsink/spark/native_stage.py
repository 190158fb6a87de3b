"""Unordered parts written by Spark's own Parquet writer (a local-folder shard): no Python hand-off.

:func:`stage_native` writes the DataFrame with ``df.write.parquet`` into a fresh, unique
folder under the description's parts prefix (``parts/<desc_id>[/<label>]/spark-<uuid>/``),
with the least JVM-side work (the columns as they are, in shard order; a cast, a float
canonicalisation or a null guard only where a column needs one), and then, on the driver,
validates the rows from the written files' footers (the checks of
:func:`shardsink.core.updates.validate_updates`, in its order), builds one
:class:`~shardsink.core.state.PartMeta` per written file and renames it to a fresh part
key (the write handle's spec names it: :meth:`shardsink.core.builder.PartWriterSpec.fresh_key`,
``<prefix>/<uuid>.parquet``; a local rename, cheap). The JVM→Python Arrow hand-off alone
costs about 1.8x a plain ``df.write.parquet`` (bench/spark_staging_floor.py), so this is the
only way unordered staging can run at Spark's own speed.

Eligible (:func:`native_plan`): a local-folder shard (the JVM here has no hadoop-aws, and
Spark's bundled Hadoop has no ``s3a`` file system without extra jars, so S3 keeps the
executors' pyarrow path), a path Hadoop takes literally, and columns whose Spark types are
exactly those the Python path would write (signed integers, float32/64, bool, string,
binary, date32; ``_time``/``_diff`` any integer type). Anything else returns None and the
caller takes the Python path, which raises the precise error for a bad input.

Validation: a ``_time``/``_diff`` column, or a column the shard declares required, that Spark
knows is non-nullable is written as it is; a nullable one goes through
``coalesce(c, raise_error(mark), 0)`` (non-nullable, so written ``required`` as the Python
path writes it), which stops the job at its first null; the exact null counts are then taken
by a second pass over ``df`` (the error path only). Zero
diffs are counted from the ``_diff`` column of the files whose statistics admit a zero (a
frame without ``_diff`` has none); the bounds from the ``_time`` statistics; equal
rows whose ``_diff`` sums leave int64 are refused as the Python path refuses them
(:func:`shardsink.spark.diff_sums.check_staged_sums`: free when the files' ``_diff`` statistics
bound every sum inside int64, else one exact aggregation of ``df``; a frame without ``_diff``
cannot overflow).

Same parts as the Python path: the user columns in shard order, then ``_time`` and
``_diff`` (int64, required), floats canonical (``-0.0`` as ``0.0``, every NaN the one quiet
NaN: :mod:`shardsink.core.floats`); but a frame without ``_diff`` (ingest: every diff is 1)
writes no ``_diff`` column and records its parts as ``diffs="ones"``
(:data:`shardsink.core.state.PartDiffs`; writing the constant cost Spark's writer ~15% CPU at
20M rows, ``bench/spark_staging_floor.py``); encoding ``"default"``
is snappy with dictionaries for every column but ``_time`` and statistics for ``_time`` and
``_diff`` only; ``"compact"`` is zstd. Parts are cut by ``maxRecordsPerFile`` from an
estimate of a row's in-memory size (``target_part_bytes`` is approximate here).

SUBTLE (what is listed): Spark's task retries and speculative attempts write under
``_temporary/`` and only the attempt the commit coordinator admits is moved into the folder
at job commit; the driver lists files only after ``save`` returned (the job committed), only
directly inside its own unique folder, only ``part-*`` files (never ``_temporary``,
``_SUCCESS`` or the hidden ``.crc`` checksums), and skips 0-row files (an empty DataFrame
writes one). A re-run of the task (a twin) writes another unique folder and fresh keys; the
parts its manifest does not list are leftovers the append deletes (the blob lists
``parts/<desc_id>/`` recursively). If validation fails, InvalidUsageError (the Python
path's class and message; counts here are over the whole DataFrame, not one partition) is
raised and the folder is removed (no file is renamed before all files are checked); a driver
killed before that leaves Spark's files under the description's prefix: ``part-*``/``_SUCCESS``
are leftovers the append deletes, the hidden ``.crc`` files and empty folders are not listed
by the store and stay (bytes).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core.state import PartDiffs, PartMeta
from shardsink.core.updates import DIFF, TIME, null_error
from shardsink.errors import InvalidUsageError
from shardsink.spark.diff_sums import check_staged_sums, col, stats_range
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from shardsink.core.write import PartWriterSpec

#: Characters Hadoop's Path would not take literally (globs, a scheme separator, escapes).
_UNSAFE_PATH = re.compile(r"[*?\[\]{}\\%:,]")
_FOLDER = "spark-"  # not hidden: the store lists it, so the append deletes a killed run's files


def _eligible_type(t: pa.DataType) -> bool:
    return ((pa.types.is_integer(t) and pa.types.is_signed_integer(t)) or pa.types.is_float32(t)
            or pa.types.is_float64(t) or pa.types.is_boolean(t) or t in (pa.string(), pa.binary(), pa.date32()))


def _row_bytes(schema: pa.Schema) -> int:
    """A guess of one row's in-memory size (Arrow layout), to cut parts of about the target size."""
    total = 16  # _time + _diff
    for f in schema:
        total += 32 if f.type in (pa.string(), pa.binary()) else max(1, f.type.bit_width // 8)
    return total


@dataclass(frozen=True)
class NativePlan:
    """Where and how :func:`stage_native` writes: the shard's folder and the write handle's
    spec of the description's parts (prefix, fresh keys, part options)."""

    root: Path
    spec: PartWriterSpec


def native_plan(df: DataFrame, spec: PartWriterSpec, *, schema: pa.Schema) -> NativePlan | None:
    """The plan of a native write of the parts ``spec`` describes (from
    :meth:`shardsink.core.write.WriteHandle.part_writer`), or None when the Python path must
    stage ``df`` (see the module doc)."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    if spec.dry_run:
        return None
    u = parse_url(spec.url)
    if u.scheme != "file" or _UNSAFE_PATH.search(u.path):
        return None
    fields = df.schema.fields
    names = [f.name for f in fields]
    if len(set(names)) != len(names) or TIME not in names:
        return None
    expected = {f.name for f in schema} | {TIME, DIFF}
    if set(names) - expected or any(f.name not in names for f in schema):
        return None
    got = {f.name: f.dataType for f in fields}
    for f in schema:
        if not _eligible_type(f.type) or got[f.name] != from_arrow_type(f.type):
            return None
    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if not isinstance(got[TIME], integral) or (DIFF in got and not isinstance(got[DIFF], integral)):
        return None
    return NativePlan(Path(u.path), spec)


def stage_if_native(df: DataFrame, spec: PartWriterSpec, *, schema: pa.Schema, lower: int, upper: int | None,
                    required: bool) -> list[PartMeta] | None:
    """:func:`stage_native` where :func:`native_plan` allows it, else None (the caller stages with
    Python), or with ``required`` InvalidUsageError naming why Spark cannot write the parts."""
    plan = native_plan(df, spec, schema=schema)
    if plan is not None:
        return stage_native(df, plan, schema=schema, lower=lower, upper=upper)
    if required:
        raise InvalidUsageError(f"Spark cannot write the parts of {spec.url} itself (not a local folder, a "
                                f"path Hadoop would not take literally, or columns {df.dtypes} that are not "
                                f"exactly the shard's {schema}); use writer='auto'", value=spec.url)
    return None


def _canonical(c: Column, t: pa.DataType) -> Column:
    """A float column canonical (:mod:`shardsink.core.floats`); anything else as it is."""
    from pyspark.sql import functions as F

    if not (pa.types.is_float32(t) or pa.types.is_float64(t)):
        return c
    spark_t = "float" if pa.types.is_float32(t) else "double"
    # Spark's = treats -0.0 as 0.0; Spark's NaN literal is Java's canonical quiet NaN.
    return (F.when(F.isnan(c), F.lit(float("nan")).cast(spark_t))
            .when(c == 0, F.lit(0.0).cast(spark_t)).otherwise(c))


_NULL_MARK = "shardsink-native-stage-null-"  # raise_error's message: a null in a required column stopped the write


def _zero(t: pa.DataType) -> Column:
    """A non-null literal of the Spark type of ``t`` (an eligible type, :func:`_eligible_type`)."""
    import datetime

    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    if pa.types.is_boolean(t):
        return F.lit(False)
    if t == pa.string():
        return F.lit("")
    if t == pa.binary():
        return F.lit(bytearray())
    if t == pa.date32():
        return F.lit(datetime.date(1970, 1, 1))
    return F.lit(0).cast(from_arrow_type(t))


def _required(c: Column, nullable: bool, mark: str, t: pa.DataType) -> Column:
    """``c`` (of the Spark type of ``t``) as a non-nullable column (written ``required``, as the
    Python path writes ``_time``, ``_diff`` and the shard's required columns).

    A column Spark knows has no nulls is written as it is (no projection work). A nullable one
    fails the job on its first null (``raise_error``; the trailing literal is never evaluated,
    it only makes the expression non-nullable): the exact counts are taken after the failure.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    if not nullable:
        return c
    return F.coalesce(c, F.raise_error(F.lit(mark)).cast(from_arrow_type(t)), _zero(t))


def _raise_nulls(df: DataFrame, required: list[str]) -> None:
    """The refusal of the first of ``required`` (in :func:`validate_updates`' order) holding a
    null, with its null count over ``df`` (only after a write stopped on one: a second pass)."""
    from pyspark.sql import functions as F

    have = [n for n in required if n in df.columns]
    row = df.agg(*[F.count_if(col(n).isNull()).alias(f"n{i}") for i, n in enumerate(have)]).collect()[0]
    for i, n in enumerate(have):
        if row[f"n{i}"]:
            raise null_error(n, int(row[f"n{i}"]))


def stage_native(df: DataFrame, plan: NativePlan, *, schema: pa.Schema, lower: int,
                 upper: int | None) -> list[PartMeta]:
    """Write ``df`` as unordered parts with Spark's Parquet writer, then validate from the footers.

    ``plan`` from :func:`native_plan` (its spec's options: the part size and encoding). Raises
    InvalidUsageError (nothing listed, the folder removed) if a row fails validation. See the
    module docstring for what is listed.
    """
    from pyspark.sql import types as T

    target_part_bytes, encoding = plan.spec.options.target_bytes, plan.spec.options.encoding
    got = {f.name: f for f in df.schema.fields}
    mark = f"{_NULL_MARK}{uuid.uuid4().hex}"

    def long_col(name: str) -> Column:
        c = col(name) if isinstance(got[name].dataType, T.LongType) else col(name).cast("long")
        return _required(c, got[name].nullable, mark, pa.int64()).alias(name)

    def user_col(f: pa.Field) -> Column:
        c = _canonical(col(f.name), f.type)
        return (c if f.nullable else _required(c, got[f.name].nullable, mark, f.type)).alias(f.name)

    ones = DIFF not in got  # every diff is 1: not written (PartMeta.diffs "ones")
    out = df.select(*[user_col(f) for f in schema], long_col(TIME), *([] if ones else [long_col(DIFF)]))
    folder = plan.root / plan.spec.prefix / f"{_FOLDER}{uuid.uuid4().hex}"
    w = out.write.mode("error").option("maxRecordsPerFile", max(1, target_part_bytes // _row_bytes(schema)))
    if encoding == "compact":
        w = w.option("compression", "zstd")
    else:
        w = (w.option("compression", "snappy").option(f"parquet.enable.dictionary#{TIME}", "false")
             .option("parquet.column.statistics.enabled", "false")
             .option(f"parquet.column.statistics.enabled#{TIME}", "true"))
        if not ones:
            w = w.option(f"parquet.column.statistics.enabled#{DIFF}", "true")
    try:
        try:
            w.parquet(f"file://{folder}")  # SUBTLE: unencoded: Hadoop takes %2B literally (as_uri encodes "+")
        except Exception as e:
            if mark not in str(e):
                raise
            _raise_nulls(df, [*(f.name for f in schema if not f.nullable), TIME, DIFF])
            raise  # SUBTLE: the null vanished between the passes (a nondeterministic frame): Spark's error
        files = _validated(folder, lower=lower, upper=upper, diffs=not ones)
        ranges = [f.diffs for f in files]
        max_abs = None if None in ranges else max((max(-r[0], r[1]) for r in ranges if r is not None), default=0)
        check_staged_sums(df, schema.names, max_abs=max_abs, rows=sum(f.rows for f in files))
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _publish(plan, folder, files, diffs="ones" if ones else "column")


@dataclass(frozen=True)
class _File:
    path: Path
    rows: int
    min_time: int
    max_time: int
    diffs: tuple[int, int] | None  # min and max _diff from the statistics (None: unknown)


def _validated(folder: Path, *, lower: int, upper: int | None, diffs: bool) -> list[_File]:
    """The committed non-empty files in ``folder``, checked from their footers as :func:`validate_updates` does.

    Nulls cannot be there (``_time``/``_diff`` and the shard's required columns are written
    required: :func:`_required`); equal
    rows summing outside int64 are checked by the caller (:func:`check_staged_sums`); zero
    diffs are counted in the files whose ``_diff`` statistics admit a zero (or have none;
    ``diffs`` False: the files store no ``_diff``, every diff is 1), then the bounds are
    checked against the ``_time`` statistics.
    """
    files, zeros = [], 0
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if not name.startswith("part-") or not path.is_file():
            continue  # _SUCCESS, .crc checksums, _temporary (emptied by the commit)
        meta = pq.read_metadata(path)
        if meta.num_rows == 0:
            continue
        dmin_dmax = stats_range(meta, DIFF) if diffs else (1, 1)
        if dmin_dmax is None or dmin_dmax[0] <= 0 <= dmin_dmax[1]:
            d = pq.read_table(path, columns=[DIFF])[DIFF]
            zeros += meta.num_rows - pc.count(pc.filter(d, pc.not_equal(d, 0))).as_py()
        trange = stats_range(meta, TIME) or _read_range(path)
        files.append(_File(path, meta.num_rows, *trange, diffs=dmin_dmax))
    if zeros:
        raise InvalidUsageError(f"column {DIFF!r} has {zeros} zero values; diffs must be non-zero")
    if files:
        tmin, tmax = min(f.min_time for f in files), max(f.max_time for f in files)
        if tmin < lower or (upper is not None and tmax >= upper):
            raise InvalidUsageError(
                f"times [{tmin}, {tmax}] fall outside the batch bounds [{lower}, {upper}); "
                "every _time must satisfy lower <= _time < upper"
            )
    return files


def _publish(plan: NativePlan, folder: Path, files: list[_File], *, diffs: PartDiffs) -> list[PartMeta]:
    """PartMeta of each validated file, renamed to a fresh part key; the folder (0-row files, _SUCCESS) removed."""
    parts = []
    for f in files:
        key = plan.spec.fresh_key()
        target = plan.root / key
        os.rename(f.path, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)  # Hadoop's local writer does not sync; the manifest will name this file
        finally:
            os.close(fd)
        parts.append(PartMeta(key, f.rows, target.stat().st_size, f.min_time, f.max_time, "unordered", diffs))
    shutil.rmtree(folder, ignore_errors=True)
    fd = os.open(plan.root / plan.spec.prefix, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return parts


def _read_range(path: Path) -> tuple[int, int]:
    mm = pc.min_max(pq.read_table(path, columns=[TIME])[TIME])
    return int(mm["min"].as_py()), int(mm["max"].as_py())
