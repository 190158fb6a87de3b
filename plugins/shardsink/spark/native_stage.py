"""Unordered parts written by Spark's own Parquet writer (a local-folder shard): no Python hand-off.

:func:`stage_native` writes the DataFrame with ``df.write.parquet`` into a fresh, unique
folder under the description's parts prefix (``parts/<desc_id>[/<label>]/spark-<uuid>/``),
validates the rows in the same pass (``df.observe``: one aggregate per check of
:func:`shardsink.core.updates.validate_updates`), and then, on the driver, builds one
:class:`~shardsink.core.state.PartMeta` per written file from its Parquet footer and renames
it to a fresh part key (:func:`shardsink.core.keys.part_key`: ``<prefix>/<uuid>.parquet``; a
local rename, cheap). The JVM→Python Arrow hand-off alone costs about 1.8x a plain
``df.write.parquet`` (bench/spark_staging_floor.py), so this is the only way unordered
staging can run at Spark's own speed.

Eligible (:func:`native_plan`): a local-folder shard (the JVM here has no hadoop-aws, and
Spark's bundled Hadoop has no ``s3a`` file system without extra jars, so S3 keeps the
executors' pyarrow path), a path Hadoop takes literally, and columns whose Spark types are
exactly those the Python path would write (signed integers, float32/64, bool, string,
binary, date32; ``_time``/``_diff`` any integer type). Anything else returns None and the
caller takes the Python path, which raises the precise error for a bad input.

Same parts as the Python path: the user columns in shard order, then ``_time`` and
``_diff`` (int64, required), floats canonical (``-0.0`` as ``0.0``, every NaN the one quiet
NaN: :mod:`shardsink.core.floats`), a missing ``_diff`` written as 1; encoding ``"default"``
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
raised and the folder is removed; a driver killed before that leaves Spark's files under
the description's prefix: ``part-*``/``_SUCCESS`` are leftovers the append deletes, the
hidden ``.crc`` files and empty folders are not listed by the store and stay (bytes).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsink.core import keys
from shardsink.core.part_io import PartEncoding
from shardsink.core.state import PartMeta
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import InvalidUsageError
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

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
    """Where and how :func:`stage_native` writes: the shard's folder and the parts prefix."""

    root: Path
    prefix: str


def native_plan(df: DataFrame, *, shard_url: str, schema: pa.Schema, desc_id: str,
                label: str | None) -> NativePlan | None:
    """The plan of a native write, or None when the Python path must stage ``df`` (see the module doc)."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    u = parse_url(shard_url)
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
    return NativePlan(Path(u.path), keys.parts_prefix(desc_id, label=label))


def _canonical(c: Column, t: pa.DataType) -> Column:
    """A float column canonical (:mod:`shardsink.core.floats`); anything else as it is."""
    from pyspark.sql import functions as F

    if not (pa.types.is_float32(t) or pa.types.is_float64(t)):
        return c
    spark_t = "float" if pa.types.is_float32(t) else "double"
    # Spark's = treats -0.0 as 0.0; Spark's NaN literal is Java's canonical quiet NaN.
    return (F.when(F.isnan(c), F.lit(float("nan")).cast(spark_t))
            .when(c == 0, F.lit(0.0).cast(spark_t)).otherwise(c))


def _checked(obs: Any, *, lower: int, upper: int | None) -> int:
    """The observed row count, or InvalidUsageError as :func:`validate_updates` words it."""
    m = obs.get
    if m["time_nulls"]:
        raise InvalidUsageError(f"column {TIME!r} has {m['time_nulls']} null values; times must be set")
    if m["diff_nulls"]:
        raise InvalidUsageError(f"column {DIFF!r} has {m['diff_nulls']} null values")
    if m["diff_zeros"]:
        raise InvalidUsageError(f"column {DIFF!r} has {m['diff_zeros']} zero values; diffs must be non-zero")
    rows = int(m["rows"])
    tmin, tmax = m["tmin"], m["tmax"]
    if rows and (tmin < lower or (upper is not None and tmax >= upper)):
        raise InvalidUsageError(
            f"times [{tmin}, {tmax}] fall outside the batch bounds [{lower}, {upper}); "
            "every _time must satisfy lower <= _time < upper"
        )
    return rows


def stage_native(df: DataFrame, plan: NativePlan, *, schema: pa.Schema, lower: int, upper: int | None,
                 target_part_bytes: int, encoding: PartEncoding) -> list[PartMeta]:
    """Write ``df`` as unordered parts with Spark's Parquet writer; validate in the same pass.

    ``plan`` from :func:`native_plan`. Raises InvalidUsageError (nothing listed, the folder
    removed) if a row fails validation. See the module docstring for what is listed.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    time, diff = F.col(TIME).cast("long"), F.col(DIFF).cast("long") if DIFF in df.columns else None
    obs = Observation(f"shardsink-stage-{uuid.uuid4().hex}")
    checks = [F.count(F.lit(1)).alias("rows"), F.min(time).alias("tmin"), F.max(time).alias("tmax"),
              F.count_if(time.isNull()).alias("time_nulls")]
    if diff is not None:
        checks += [F.count_if(diff.isNull()).alias("diff_nulls"), F.count_if(diff == 0).alias("diff_zeros")]
    else:
        checks += [F.lit(0).alias("diff_nulls"), F.lit(0).alias("diff_zeros")]
    lower_lit = F.lit(lower).cast("long")
    cols = [_canonical(F.col(f.name), f.type).alias(f.name) for f in schema]
    # coalesce: required (non-null) columns as the Python path writes them; the checks above see the nulls.
    out = df.observe(obs, *checks).select(
        *cols, F.coalesce(time, lower_lit).alias(TIME),
        F.coalesce(diff, F.lit(1).cast("long")).alias(DIFF) if diff is not None else F.lit(1).cast("long").alias(DIFF))
    folder = plan.root / plan.prefix / f"{_FOLDER}{uuid.uuid4().hex}"
    w = out.write.mode("errorifexists").option("maxRecordsPerFile", max(1, target_part_bytes // _row_bytes(schema)))
    if encoding == "compact":
        w = w.option("compression", "zstd")
    else:
        w = (w.option("compression", "snappy").option(f"parquet.enable.dictionary#{TIME}", "false")
             .option("parquet.column.statistics.enabled", "false")
             .option(f"parquet.column.statistics.enabled#{TIME}", "true")
             .option(f"parquet.column.statistics.enabled#{DIFF}", "true"))
    try:
        w.parquet(folder.as_uri())
        _checked(obs, lower=lower, upper=upper)
    except InvalidUsageError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _publish(plan, folder)


def _publish(plan: NativePlan, folder: Path) -> list[PartMeta]:
    """PartMeta of each committed file in ``folder`` (footers), renamed to a fresh part key."""
    parts = []
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if not name.startswith("part-") or not path.is_file():
            continue  # _SUCCESS, .crc checksums, _temporary (emptied by the commit)
        meta = pq.read_metadata(path)
        if meta.num_rows == 0:
            path.unlink()
            continue
        tmin, tmax = _time_range(path, meta)
        key = keys.part_key(plan.prefix)
        target = plan.root / key
        os.rename(path, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)  # Hadoop's local writer does not sync; the manifest will name this file
        finally:
            os.close(fd)
        parts.append(PartMeta(key, meta.num_rows, target.stat().st_size, tmin, tmax, "unordered"))
    shutil.rmtree(folder, ignore_errors=True)
    fd = os.open(plan.root / plan.prefix, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return parts


def _time_range(path: Path, meta: pq.FileMetaData) -> tuple[int, int]:
    """Min and max ``_time`` of a written file, from its row-group statistics (else read the column)."""
    col = meta.schema.names.index(TIME)
    lo: int | None = None
    hi: int | None = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max:
            t = pq.read_table(path, columns=[TIME])[TIME]
            mm = pc.min_max(t)
            return int(mm["min"].as_py()), int(mm["max"].as_py())
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    assert lo is not None and hi is not None
    return int(lo), int(hi)
