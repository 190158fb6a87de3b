"""The source interface of the ingest sink: a watermark, and a per-slot read in Spark.

A source is described by a small **spec**: a typed struct of the tagged union
:data:`shardsink.specs.SourceSpec`, whose JSON layout is ``{"kind": ..., ...}``
(``Source.spec()`` returns that dict layout), so that it can travel from the DAG file to
the Airflow tasks and on to the spark-submit job inside its request. Specs name
locations and settings, never secrets: credentials come from the environment of the
process that reads (the AWS chain).

Contract every source keeps:

* ``watermark()``: all of the source's data with event time ``< watermark`` is complete
  and will not change. ``None`` means nothing is complete yet. It never moves back.
* ``read_slot(spark, lower=, upper=, slot=i, slots=n, seal=)``: a DataFrame of the
  shard's user columns plus ``_time`` (int64 ms) holding exactly the source rows with
  ``lower <= _time < upper`` that belong to slot ``i`` of ``n``. Slots partition the
  source: every row belongs to exactly one slot, and the assignment is stable (the
  same row lands in the same slot on every attempt), so the union over slots is the
  whole range exactly once.
* Refuse, with an error naming the input, what cannot be ingested correctly: late data
  (event times that were already sealed when the data appeared) and malformed input.
  Nothing is ever dropped silently.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from shardsink.errors import InvalidUsageError
from shardsink.specs import SourceSpec, spec_from_builtins, spec_kind, spec_to_builtins

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Seal:
    """When the shard sealed the times ``[lower, upper)``: commit ``seqno``, as of ``at`` (epoch
    seconds): the time of the source listing that fixed the commit's input (the source store's
    clock), else the commit's own time. ``held``: ``(key, appeared)`` of inputs that listing
    read although they appeared at or after ``at``.

    Sources use seals to tell late data (appeared at or after its times were sealed, and not
    read by the sealing commit) from old data that was already ingested.
    """

    lower: int
    upper: int
    seqno: int
    at: float
    held: frozenset[tuple[str, float]] = frozenset()


@dataclass(frozen=True)
class Sealing:
    """What the shard had sealed when a mint read it: every time below ``upper``, and
    ``seals_from(t)``: the seals covering the times from ``t`` up (read on demand, back only as
    far as ``t``: :func:`shardsink.sinks.seals.seals`)."""

    upper: int | None
    seals_from: Callable[[int], Sequence[Seal]]


@runtime_checkable
class Source(Protocol):
    """What the ingest sink needs from a source; see the module docstring for the contract."""

    kind: str

    def spec(self) -> dict[str, Any]:
        """A JSON-able description from which :func:`source_from_spec` rebuilds the source."""
        ...

    def watermark(self) -> int | None: ...

    def schema(self) -> pa.Schema | None:
        """The user columns, if the source knows them (used to create a missing shard)."""
        ...

    def read_slot(
        self,
        spark: SparkSession,
        *,
        lower: int,
        upper: int,
        slot: int,
        slots: int,
        schema: pa.Schema,
        seals: Sequence[Seal] = (),
    ) -> tuple[DataFrame, list[dict[str, Any]]]:
        """The slot's rows in ``[lower, upper)`` and a JSON-able list of the inputs it read."""
        ...


_KINDS: dict[str, str] = {
    "landing": "shardsink.sources.landing:LandingSource",
    "files": "shardsink.sources.files:FileArrivals",
    "kafka": "shardsink.sources.kafka:KafkaSource",
}


def register_kind(kind: str, target: str) -> None:
    """Make ``{"kind": kind}`` specs build ``target`` (``"package.module:Class"``)."""
    _KINDS[kind] = target


def source_from_spec(spec: Mapping[str, Any] | SourceSpec) -> Source:
    """Rebuild a source from its spec: a typed one (:mod:`shardsink.specs`) or its dict layout.

    ``kind`` is a registered name or ``"module:Class"``; a spec that does not fit its kind is
    an InvalidUsageError naming the field.
    """
    typed = spec_from_builtins(spec)
    kind = spec_kind(typed)
    target = _KINDS.get(kind, kind)
    if ":" not in target:
        raise InvalidUsageError(f"unknown source kind {kind!r}; expected one of {sorted(_KINDS)} or 'module:Class'")
    mod, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise InvalidUsageError(f"source kind {kind!r}: cannot import {target}: {e}") from e
    own = getattr(cls, "spec_type", None)
    # Our sources take their typed spec; anything else gets the dict layout it always got.
    src = cls.from_spec(typed if own is not None and isinstance(typed, own) else spec_to_builtins(typed))
    if not isinstance(src, Source):
        raise InvalidUsageError(f"source kind {kind!r} built {type(src).__name__}, which is not a Source")
    return src


def source_spec(source: Source) -> SourceSpec:
    """The typed spec of ``source`` (from its dict layout, so a subclass's own kind and fields are kept)."""
    return spec_from_builtins(source.spec(), where=f"spec of {type(source).__name__}")


def map_on_executors(df: DataFrame, read: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                     schema: Any) -> DataFrame:
    """``df.mapInArrow(read, schema)`` with typed errors: the one way a source reads on executors.

    A ShardsinkError raised by ``read`` on an executor (a changed, vanished or malformed
    file; a late row; a Kafka range that cannot be read) reaches the driver as its typed
    record (:func:`shardsink.outcome.carry_errors`), so the write job's outcome says
    ``MalformedInputError`` and the Airflow task fails at once instead of retrying an
    ``UnexpectedError``. Every source's ``read_slot`` goes through here.
    """
    from shardsink.outcome import carry_errors

    before_python_tasks(df.sparkSession)
    return df.mapInArrow(carry_errors(read), schema)


#: The attribute of a session holding what must run before its first Python task on the
#: executors (a Spark Connect write session's check of the server's Python: the probe of
#: :func:`shardsink.spark.connect.connect_session`, deferred until a job needs those workers).
BEFORE_PYTHON = "_shardsink_before_python"


def before_python_tasks(spark: Any) -> None:
    """Run (once) the check ``spark`` holds for its first Python task, if any (:data:`BEFORE_PYTHON`).

    Every plan that runs Python on the executors calls it first (:func:`map_on_executors`, the
    Python staging path); a session whose work runs none never pays for starting those workers."""
    check = getattr(spark, BEFORE_PYTHON, None)
    if check is not None:
        setattr(spark, BEFORE_PYTHON, None)
        check()


def spread_rows(spark: SparkSession, rows: Sequence[tuple[Any, ...]], ddl: str) -> DataFrame:
    """A DataFrame of the driver-side ``rows`` (a DDL schema ``ddl``) spread over up to twice the
    cluster's cores, one or more rows per partition: the work list a source hands to
    :func:`map_on_executors`. Works on a classic session (``parallelize``) and on a Spark Connect
    session, which has no ``sparkContext`` (the rows travel in the plan, then ``repartition``).
    """
    if is_connect(spark):
        n = max(1, min(len(rows), 2 * _connect_cores(spark)))
        return spark.createDataFrame(list(rows), ddl).repartition(n)
    n = max(1, min(len(rows), spark.sparkContext.defaultParallelism * 2))
    return spark.createDataFrame(spark.sparkContext.parallelize(list(rows), n), ddl)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _connect_cores(spark: Any) -> int:
    """The server's default parallelism as its conf says (a Connect client cannot ask the
    scheduler): ``spark.default.parallelism``, else 2."""
    try:
        return max(1, int(spark.conf.get("spark.default.parallelism", "2") or 2))
    except Exception:
        return 2
