"""Row-wise views: the correction in one aggregation, without consolidating the input.

A view ``V`` of ONE snapshot-mode input is *row-wise* when its analysed plan, from the
root down to the input, has only projections and filters (``Project``, ``Filter`` and the
``SubqueryAlias``/``View`` wrappers a temp view adds), with deterministic expressions and
no subquery. Such a view maps each input row on its own, so it is linear over
multisets: ``V(A ⊎ B) = V(A) ⊎ V(B)``. The view's contents are then
``V(positive updates) - V(negative updates)`` (each update repeated ``|_diff|`` times),
which :func:`shardsink.spark.correction.linear_correction` sums together with the
persisted rows in ONE ``groupBy``: the snapshot's own consolidation of the input (a
second shuffle over every input row) is skipped. The result is exactly the correction
of :func:`shardsink.spark.correction.correction_frame` over the consolidated snapshot.

Anything else (aggregates, DISTINCT, joins, windows, LIMIT, unions, generators,
``rand()``, ``input_file_name()``, a ``_count`` output column, several inputs, an
``updates``-mode input) takes the general path. The check runs on the driver against
an empty frame of the input's schema, before any lease or job.

HAZARD: the check reads the JVM's analysed plan (``DataFrame._jdf``). A Spark Connect client has
none, so over Connect every view takes the general path: the same contents, without the
incremental basis (:mod:`shardsink.spark.incremental`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardsink.core.shard import Shard
from shardsink.core.updates import COUNT, DIFF, TIME
from shardsink.spark import types as sty
from shardsink.spark.diff_sums import cols as col_refs
from shardsink.spark.incremental import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import DataFrame, SparkSession

    from shardsink.core.state import Version
    from shardsink.sinks.materialize import View
    from shardsink.spark.read import ShardReads

#: Plan nodes that map each row of their child on its own (when their expressions are
#: deterministic and hold no subquery).
_ROW_WISE = frozenset({"Project", "Filter", "SubqueryAlias", "View"})


def is_row_wise(result: DataFrame, source: DataFrame) -> bool:
    """Whether ``result``'s analysed plan is only row-wise nodes on top of ``source``'s plan."""
    try:
        target: Any = source._jdf.queryExecution().analyzed()
        node: Any = result._jdf.queryExecution().analyzed()
        while not node.equals(target):
            if node.getClass().getSimpleName() not in _ROW_WISE or node.children().size() != 1:
                return False
            if not node.deterministic() or node.subqueries().size() != 0:
                return False
            node = node.children().apply(0)
        return True
    except Exception:  # no JVM plan to inspect (e.g. Spark Connect): the general path
        return False


@dataclass(frozen=True, kw_only=True)
class RowWiseView:
    """A row-wise view's one input, and its definition fingerprint (None: not fingerprintable,
    see :func:`shardsink.spark.incremental.fingerprint`)."""

    name: str
    url: str
    fingerprint: str | None


def row_wise_view(spark: SparkSession, v: View, *, run: Callable[[dict[str, DataFrame]], DataFrame],
                  heads: Mapping[str, Version] | None = None) -> RowWiseView | None:
    """``v``'s input if ``v`` is row-wise, else None (module docstring). Driver only: no lease, no job.
    ``heads``: the inputs' state versions the caller read, by URL (else one head read)."""
    if len(v.inputs) != 1:
        return None
    (name, inp), = v.inputs.items()
    if inp.mode != "snapshot":
        return None
    head = heads.get(inp.url) if heads is not None else None
    schema = (head if head is not None else Shard(inp.url).reader().head()).header.schema
    probe = spark.createDataFrame([], sty.spark_schema(schema, time=False, diff=None))
    if COUNT in (shaped := run({name: probe})).columns or not is_row_wise(shaped, probe):
        return None
    return RowWiseView(name=name, url=inp.url, fingerprint=fingerprint(shaped, v, input_schema=str(schema)))


def signed_views(rw: RowWiseView, raw: DataFrame, *,
                 run: Callable[[dict[str, DataFrame]], DataFrame]) -> tuple[DataFrame, DataFrame]:
    """``(V(updates of raw with _diff > 0), V(those with _diff < 0))``, each update repeated
    ``|_diff|`` times; ``raw`` = the input's user columns + ``_diff`` (+ ``_time``, ignored)."""
    from pyspark.sql import functions as F

    quoted = col_refs([c for c in raw.columns if c not in (DIFF, TIME)])  # a dot in a name is not syntax

    def repeated(sign: int) -> DataFrame:
        # Plain comparisons of _diff, which Spark pushes into the Parquet scans: with _diff
        # statistics in the parts (shardsink.core.part_io) row groups without such diffs are
        # skipped unread (a shard of insertions has no negative diff to scan for).
        diff = F.col(DIFF)
        once = raw.filter(diff == sign).select(*quoted)
        many = raw.filter(diff > 1) if sign > 0 else raw.filter(diff < -1)
        ones = F.array_repeat(F.lit(True), (diff * sign).cast("int"))
        return once.unionByName(many.withColumn("__n", F.explode(ones)).select(*quoted))

    return run({rw.name: repeated(1)}), run({rw.name: repeated(-1)})


def linear_view_frames(reads: ShardReads, v: View, *, as_of: int, run: Callable[[dict[str, DataFrame]], DataFrame],
                       heads: Mapping[str, Version] | None = None) -> tuple[DataFrame, DataFrame] | None:
    """``(V(positive updates), V(negative updates))`` of ``v``'s one input as of ``as_of``
    (leased by ``reads``), or None if ``v`` is not row-wise (module docstring).

    ``run(frames)`` applies the view to named input frames (the caller's query runner,
    which turns Spark's analysis errors into InvalidUsageError). ``heads``: the inputs'
    state versions the caller read, by URL (else one head read).
    """
    rw = row_wise_view(reads.spark, v, run=run, heads=heads)
    if rw is None:
        return None
    return signed_views(rw, reads.updates(rw.url, as_of, at=heads.get(rw.url) if heads else None), run=run)
