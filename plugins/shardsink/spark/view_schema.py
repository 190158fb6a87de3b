"""A view's output schema when its query changes shape: evolve it, or refuse naming the fix.

::

    evo = evolution(query_schema, at.header, url=URL)   # None: the query fits the output as is
    projected_persisted(persisted, evo.target)           # the output's rows as read under evo.target
    evolve_output(shard, evo, at=at, writer=W)           # -> the schema id of evo.target (one commit)

The query's output (its analysed schema, every column nullable: :func:`output_schema`) is
compared with the output shard's current schema column by column, by name, through Spark's
types (a ``large_string`` column holds a Spark ``string``, a ``timestamp[ms]`` one a Spark
``timestamp``: no change). The output **evolves by itself** only when

* the query has a column the output lacks: added, nullable (``SchemaChange(kind="add")``);
* a column's type widens (:func:`shardsink.core.schema.widens`: int8 → int16 → int32 →
  int64, float → double, a decimal's precision up at the same scale, string → large_string).

The target schema keeps the output's column order (new columns last, in the query's order),
so it is exactly the schema :func:`shardsink.core.schema.evolve` produces from those changes.

**Everything else is refused** (InvalidUsageError, the output unchanged): a column gone from
the query (dropped or renamed), a narrowed or incompatible type. The message names each
column with its old and new type and the commands that fix it: ``shardsink schema URL --drop
NAME`` (the next run then re-adds the column with the query's type, if it still has it),
``--rename OLD:NEW`` when one column looks renamed, a CAST in the query that keeps the old
type, or a new output shard.

A run whose output evolves compares in FULL (:mod:`shardsink.spark.view`): the rows
persisted before read with nulls in the added columns (widened ones cast), so every row
differs from the query's and is corrected. A view's fingerprint covers the output's schema
id (:func:`shardsink.spark.incremental.output_fingerprint`), so no later run builds
incrementally on a basis computed under another schema.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardsink.core import schema as sch
from shardsink.core.state import Header, Version
from shardsink.core.transitions import SchemaConflict, Unchanged
from shardsink.core.updates import COUNT, DIFF, check_schema
from shardsink.errors import InvalidUsageError
from shardsink.spark import types as sty

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shardsink.core.shard import Shard

_WIDENINGS = "int8 -> int16 -> int32 -> int64, float -> double, a decimal's precision up at the same scale"


@dataclass(frozen=True, kw_only=True)
class Evolution:
    """The schema ``changes`` that turn the output's schema ``base_id`` into ``target`` (its
    user columns in the output's order, the query's new columns last)."""

    base_id: int
    changes: tuple[sch.SchemaChange, ...]
    target: pa.Schema

    def describe(self) -> str:
        return ", ".join(c.describe() for c in self.changes)


def output_schema(desired: DataFrame) -> pa.Schema:
    """The Arrow schema of the query's output (all columns nullable, ``_count`` left out)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(desired.schema, timezone="UTC")
    schema = pa.schema([pa.field(f.name, f.type, nullable=True) for f in arrow if f.name != COUNT])
    check_schema(schema, what="the view query's output")
    return schema


def _same_in_spark(old: pa.Field, new: pa.Field) -> bool:
    """Whether Spark sees ``old`` and ``new`` as the same type (the staging casts between them)."""
    if old.type == new.type:
        return True
    try:
        return bool(sty.spark_type(old) == sty.spark_type(new))
    except InvalidUsageError:
        return False


def _spark_name(field: pa.Field) -> str:
    try:
        return str(sty.spark_type(field).simpleString().upper())
    except InvalidUsageError:
        return str(field.type)


def plan(current: pa.Schema, query: pa.Schema, *, url: str, schema_id: int) -> tuple[list[sch.SchemaChange],
                                                                                        pa.Schema]:
    """The changes from ``current`` (the output's schema ``schema_id``) to fit ``query``, and the
    target schema; InvalidUsageError naming every refused column and its fixes (module docstring)."""
    changes: list[sch.SchemaChange] = []
    fields: list[pa.Field] = []
    gone: list[pa.Field] = []
    changed: list[tuple[pa.Field, pa.Field]] = []
    for f in current:
        if f.name not in query.names:
            gone.append(f)
            continue
        q = query.field(f.name)
        if _same_in_spark(f, q):
            fields.append(f)
        elif sch.widens(f.type, q.type):
            changes.append(sch.SchemaChange(kind="widen", name=f.name, type=str(q.type)))
            fields.append(f.with_type(q.type))
        else:
            changed.append((f, q))
    added = [q for q in query if q.name not in current.names]
    unnamed = [q for q in added if not _has_alias(q.type)]
    if gone or changed or unnamed:
        raise InvalidUsageError(_refusal(url, schema_id, gone, changed, added, unnamed),
                                value=(gone or [c[0] for c in changed] or unnamed)[0].name)
    for q in added:
        changes.append(sch.SchemaChange(kind="add", name=q.name, type=str(q.type), nullable=True))
        fields.append(pa.field(q.name, q.type, nullable=True))
    return changes, pa.schema(fields)


def _sql_name(name: str) -> str:
    return name if name.isidentifier() else "`" + name.replace("`", "``") + "`"


def _has_alias(t: pa.DataType) -> bool:
    try:
        return bool(sch.parse_type(str(t)) == t)
    except InvalidUsageError:
        return False


def _refusal(url: str, schema_id: int, gone: Sequence[pa.Field], changed: Sequence[tuple[pa.Field, pa.Field]],
             added: Sequence[pa.Field], unnamed: Sequence[pa.Field]) -> str:
    """The refusal's message: every offending column, old and new type, and the concrete fixes."""
    what = [f"column {f.name!r} ({f.type}) is not in the query's output (dropped or renamed)" for f in gone]
    what += [f"column {old.name!r} changed from {old.type} to {new.type}, which is not a widening"
             for old, new in changed]
    what += [f"new column {q.name!r} has type {q.type}, which a schema change cannot name" for q in unnamed]
    fixes = []
    if len(gone) == 1 and len(candidates := [q for q in added if _same_in_spark(gone[0], q)]) == 1:
        fixes.append(f"if {gone[0].name!r} was renamed to {candidates[0].name!r}: "
                     f"`shardsink schema {url} --rename {gone[0].name}:{candidates[0].name}`")
    drop = [f.name for f in gone] + [old.name for old, _ in changed]
    if drop:
        cmds = " then ".join(f"`shardsink schema {url} --drop {n}`" for n in drop)
        readd = (f" (the next run re-adds {[old.name for old, _ in changed]} with the query's types and "
                 "rewrites every row)" if changed else "")
        fixes.append(f"drop the column{'s' if len(drop) > 1 else ''} from the output: {cmds}{readd}")
    if changed:
        casts = ", ".join(f"CAST({_sql_name(old.name)} AS {_spark_name(old)})" for old, _ in changed)
        fixes.append(f"keep the old type{'s' if len(changed) > 1 else ''} in the query: {casts}")
    fixes.append("or write the view into a new output shard (another output_url: its first run creates it "
                 "from the query's schema)")
    return (f"the view query's output does not fit output shard {url} (schema {schema_id}): {'; '.join(what)}. "
            "A view's output evolves by itself only by new nullable columns and widened types "
            f"({_WIDENINGS}). To recreate the view: {'; '.join(fixes)}. The output shard was not changed")


def evolution(query: pa.Schema, header: Header, *, url: str) -> Evolution | None:
    """How the output (state ``header``) must evolve to hold ``query`` (None: it fits as is);
    InvalidUsageError if it cannot (module docstring). Pure: nothing is written."""
    cur = sch.current(header)
    changes, target = plan(sch.entry_schema(cur), query, url=url, schema_id=cur.id)
    if not changes:
        return None
    return Evolution(base_id=cur.id, changes=tuple(changes), target=target)


def projected_persisted(persisted: DataFrame | None, target: pa.Schema) -> DataFrame | None:
    """``persisted`` (the output's raw updates under its current schema: user columns +
    ``_diff``) as read under ``target``: nulls for added columns, widened ones cast. This is
    what a read through the evolved schema returns (:func:`shardsink.core.schema.project`)."""
    if persisted is None:
        return None
    from pyspark.sql import functions as F

    def ref(name: str) -> Any:  # quoted: a dot in a column name is not a struct access
        return F.col("`" + name.replace("`", "``") + "`")

    cols = [(ref(f.name) if f.name in persisted.columns else F.lit(None)).cast(sty.spark_type(f)).alias(f.name)
            for f in target]
    return persisted.select(*cols, ref(DIFF))


def probe_schema(spark: SparkSession, name: str, url: str, *, run: Callable[[dict[str, DataFrame]], DataFrame],
                 at: Version | None) -> pa.Schema:
    """The output schema of a view of the one snapshot input ``name`` (shard ``url``, state ``at``
    or one head read): its query over an empty frame of the input's schema, analysed on the
    driver (no job, no lease)."""
    from shardsink.core.shard import Shard

    schema = (at if at is not None else Shard(url).reader().head()).header.schema
    return output_schema(run({name: spark.createDataFrame([], sty.spark_schema(schema, time=False, diff=None))}))


def evolve_output(shard: Shard, evo: Evolution, *, at: Version, writer: str) -> int:
    """Make the output shard's schema ``evo.target`` in one commit (an exact evolve-to-target
    command, :meth:`shardsink.core.shard.Shard.evolve_to`) and return the schema id of
    ``evo.target``, under which the run staged its parts. ``at``: the output's version the
    evolution was planned from (schema ``evo.base_id``).

    SUBTLE (racing evolutions): a twin or retried write task, or a racing run of the same view,
    computes the same target and may commit it first. The command carries the target, and its
    rule plans the changes on the head it is applied to, in the one commit loop: a head that
    already holds exactly ``evo.target`` is Unchanged (its schema id is returned; both writers'
    manifests name the same id, and one commit was made). A head that reached another schema
    (a human's ``shardsink schema``, a racing query of another shape) is the typed refusal
    SchemaConflict, raised as InvalidUsageError: nothing of the run is committed, and the next
    run plans against the new schema.
    """
    out = shard.evolve_to(evo.target, exact=True, writer=writer)
    if isinstance(out, Version):
        return sch.current(out.header).id
    if isinstance(out, Unchanged) and out.schema_id is not None:
        return out.schema_id
    reason = out.reason if isinstance(out, SchemaConflict) else str(out)
    raise InvalidUsageError(
        f"the schema of output shard {shard.url} changed while this run evolved it ({evo.describe()}, planned from "
        f"schema {evo.base_id} at seqno {at.seqno}): {reason}; nothing of the run was committed, re-run the view",
        value=getattr(out, "column", None))
