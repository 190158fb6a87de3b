"""Stage a Spark DataFrame as parts of one description, uploaded from the executors.

Each Spark partition is handed to Python as large Arrow batches, validated against the
description's bounds, consolidated and sorted there (:func:`shardsink.core.part_io.stage_parts`
on one thread: a Spark task owns one core), written as Parquet parts with pyarrow straight
to the shard's store (local folder or S3 through boto3; no hadoop-aws), and yields one
small row per part. The driver only collects those rows. ``order="unordered"`` skips the
sort and the consolidation: the executors' Arrow batches are validated and written as
they are, as unordered parts (:data:`shardsink.core.state.PartOrder`; compaction sorts them).
For a local-folder shard, unordered parts are instead written by Spark's own Parquet writer,
validated in the same pass (:mod:`shardsink.spark.native_stage`): no hand-off to Python.

Why not sort in the JVM (``sortWithinPartitions``)? Measured on 2M rows, local[2]: the JVM
sort costs 0.4x of a plain ``df.write.parquet`` on its own, while the hand-off to Python
costs about one plain write whatever Python does; Python's sort (integer codes, one
vectorised sort, see :mod:`shardsink.core.consolidate`) and its writer, which takes the
dictionaries the sort built, add less than the JVM sort did.

SUBTLE: Spark may run a partition more than once (task retry, speculation, a lost
executor). Every run uploads parts under fresh keys in ``parts/<desc_id>/``, but only
the attempt whose result the driver collects is listed in the manifest; the others are
leftovers under a prefix the description owns, which the append step deletes after the
description commits (or loses its race). Nothing here ever overwrites an object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.core.diff_sums import check_input_sums
from shardsink.core.part_io import TARGET_PART_BYTES, PartEncoding
from shardsink.core.shard import Shard, StagedBatch
from shardsink.core.state import PART_ORDERS, PartMeta, PartOrder, Version
from shardsink.core.updates import DIFF, TIME, validate_updates
from shardsink.errors import InvalidUsageError
from shardsink.outcome import carry_errors
from shardsink.spark.diff_sums import check_staged_sums, col

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shardsink.core.write import WriteHandle

log = logging.getLogger("shardsink.spark")

#: Rows per Arrow batch handed to the Python workers while staging (Spark's default is
#: 10,000; larger batches cut per-batch overhead, and a partition is buffered whole anyway).
ARROW_BATCH_ROWS = 1 << 18
_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Who writes unordered parts: ``"auto"`` (Spark's writer where :func:`native_plan` allows it),
#: ``"spark"`` (that, or InvalidUsageError naming why not), ``"python"`` (the executors' pyarrow path).
StageWriter = Literal["auto", "spark", "python"]

_META = pa.schema([
    ("key", pa.string()),
    ("rows", pa.int64()),
    ("bytes", pa.int64()),
    ("min_time", pa.int64()),
    ("max_time", pa.int64()),
    ("order", pa.string()),
    ("dmin", pa.int64()),  # the partition's smallest and largest input _diff
    ("dmax", pa.int64()),
    ("inputs", pa.int64()),  # the partition's input rows, on its first part's row (else 0)
])


def stage_dataframe(
    df: DataFrame,
    *,
    shard_url: str,
    schema: pa.Schema,
    lower: int,
    upper: int,
    desc_id: str,
    target_part_bytes: int = TARGET_PART_BYTES,
    encoding: PartEncoding = "default",
    label: str | None = None,
    dry_run: bool = False,
    order: PartOrder = "sorted",
    writer: StageWriter = "auto",
    at: Version | None = None,
) -> list[PartMeta]:
    """Write ``df`` (user columns + ``_time`` [+ ``_diff``]) as parts of ``desc_id``; return their metadata.

    Raises (on the driver, as a Spark job failure naming the cause) if any row is outside
    ``[lower, upper)`` or does not fit ``schema``. Parts are consolidated per Spark
    partition, not globally: the shard sums diffs across parts, so that is enough.
    ``encoding`` is passed to :func:`shardsink.core.part_io.write_parts`. ``label`` adds a
    sub-folder under the description's prefix (re-processing marks correction parts so).
    ``dry_run``: encode the parts exactly as they would be written but upload nothing; the
    returned metadata (rows, bytes, times) is real, the keys name no object. ``order``:
    ``"sorted"`` parts (consolidated and sorted per Spark partition) or ``"unordered"``
    parts (the rows as Spark hands them over; no sort, no consolidation). ``writer``
    (unordered parts only, see :data:`StageWriter`): with ``"auto"`` a local-folder shard's
    unordered parts are written by Spark itself (:mod:`shardsink.spark.native_stage`; its
    validation errors are raised as InvalidUsageError on the driver, where the Python path's
    reach the driver inside a Spark job failure carrying the same record). ``at``: the shard's
    version the caller works from (its schemas give the parts' field ids without a head read).

    Equal rows (user columns and ``_time``) whose ``_diff`` sums leave int64 are refused
    (InvalidUsageError, as by :meth:`Shard.stage`): in a Spark task before it writes, and across
    tasks on the driver (:func:`_check_sums`, which deletes the parts first).
    """
    if order not in PART_ORDERS:
        raise InvalidUsageError(f"order must be 'sorted' or 'unordered', got {order!r}", value=str(order))
    if writer not in ("auto", "spark", "python"):
        raise InvalidUsageError(f"writer must be 'auto', 'spark' or 'python', got {writer!r}", value=str(writer))
    handle = Shard(shard_url).writer()
    spec = handle.part_writer(desc_id, label=label, order=order, encoding=encoding, target_bytes=target_part_bytes,
                              threads=1, dry_run=dry_run, schema=schema, at=at)  # the parts carry its field ids
    if order == "unordered" and writer != "python" and not dry_run:
        from shardsink.spark.native_stage import stage_if_native

        native = stage_if_native(df, spec, schema=schema, lower=lower, upper=upper, required=writer == "spark")
        if native is not None:
            return native
    schema_bytes = schema.serialize().to_pybytes()
    names, src = _plain_names(df)

    @carry_errors  # runs on executors: shardsink errors reach the driver as typed records
    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        user = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
        got = list(batches)
        if not got or not any(b.num_rows for b in got):
            return
        table = pa.Table.from_batches(got).rename_columns(names)
        updates = validate_updates(table, user, lower=lower, upper=upper)
        check_input_sums(updates, [*user.names, TIME], what="the appended DataFrame (one Spark partition)")
        mm = pc.min_max(updates[DIFF])
        written = spec.open().stage(updates, [*user.names, TIME])  # uploads retried (fresh keys)
        rows = [{"key": p.key, "rows": p.rows, "bytes": p.bytes, "min_time": p.min_time, "max_time": p.max_time,
                 "order": p.order, "dmin": mm["min"].as_py(), "dmax": mm["max"].as_py(),
                 "inputs": updates.num_rows if i == 0 else 0} for i, p in enumerate(written)]
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_META)

    from pyspark.sql.pandas.types import from_arrow_schema

    from shardsink.sources.base import before_python_tasks

    before_python_tasks(df.sparkSession)  # a Connect session's deferred check of the server's Python
    with _arrow_batch_rows(df.sparkSession, ARROW_BATCH_ROWS):
        out = src.mapInArrow(stage, from_arrow_schema(_META)).collect()
    parts = [PartMeta(r["key"], r["rows"], r["bytes"], r["min_time"], r["max_time"], r["order"]) for r in out]
    _check_sums(df, out, StagedBatch(desc_id, lower, upper, tuple(parts)), schema=schema,
                handle=None if dry_run else handle)
    return parts


def _check_sums(df: DataFrame, out: list[Any], staged: StagedBatch, *, schema: pa.Schema,
                handle: WriteHandle | None) -> None:
    """:func:`check_staged_sums` across the partitions, bounded by their ``_diff`` ranges and row
    counts (the collected rows ``out``): free unless ``max |diff| x rows`` can leave int64, then
    one exact aggregation of ``df``. A task refuses its own rows before writing
    (:func:`shardsink.core.diff_sums.check_input_sums`); this catches equal rows spread over
    tasks, after their parts were uploaded, so a refusal first discards ``staged`` through
    ``handle`` (None: a dry run, nothing was uploaded): parts never handed out, so they go
    although the description may still commit (:meth:`WriteHandle.discard`). Cheapest
    correct place: a check before staging would evaluate ``df`` once more on every append."""
    try:
        check_staged_sums(df, schema.names, max_abs=max((max(-r["dmin"], r["dmax"]) for r in out), default=0),
                          rows=sum(r["inputs"] for r in out))
    except BaseException:
        if handle is not None and staged.parts:
            try:
                handle.discard([staged], unpublished=True)
            except Exception:  # the refusal is the error to report; the parts stay leftovers (GC)
                log.warning("could not discard %d refused parts of description %s", len(staged.parts),
                            staged.desc_id, exc_info=True)
        raise


def _plain_names(df: DataFrame) -> tuple[list[str], DataFrame]:
    """``df``'s column names, and ``df`` itself or (a name with a dot or backtick, which
    ``mapInArrow`` would resolve as a struct field) ``df`` with its columns renamed
    positionally; the executors rename the Arrow columns back to ``names``."""
    names = list(df.columns)
    if not any("." in n or "`" in n for n in names):
        return names, df
    return names, df.select(*[col(n).alias(f"__shardsink_c{i}") for i, n in enumerate(names)])


@contextmanager
def _arrow_batch_rows(spark: SparkSession, rows: int) -> Iterator[None]:
    """Raise Spark's Arrow batch size for the job run inside (never lower it), then restore it.

    SUBTLE: a session-wide setting; a job another thread starts meanwhile on the same
    session sees it too (harmless: only batch sizes change, never results).
    """
    try:
        before = spark.conf.get(_BATCH_CONF, None)
        current = int(before) if before else 10_000
    except Exception:  # a conf we cannot read or parse: leave it alone
        yield
        return
    if current <= 0 or current >= rows:
        yield
        return
    spark.conf.set(_BATCH_CONF, str(rows))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_BATCH_CONF)
        else:
            spark.conf.set(_BATCH_CONF, before)
