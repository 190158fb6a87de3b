"""The materialize sink (self-correcting views) as plain library calls, independent of Airflow.

A **view** is a Spark SQL query (or a Python function) over NAMED input shards; its
contents as of time ``t`` are the query over every input read as of ``t``. The view is
stored in an output shard, one batch per run::

    mint_view(view, output_url, ...)  -> Description | NoOp        (no JVM)
    shardsink.spark.view.write_view(spark, view, output_url, desc) (spark-submit or Connect, 1 job)
    shardsink.sinks.append.append_from_manifests(shard, desc, 1)   (same as the ingest sink)

mint: ``lower`` = the output shard's upper (``initial_upper`` before the first run);
``upper`` = min(every input's upper, the run's interval end, ``lower + max_span``): the
view is complete up to where ALL its inputs are, so a run processes everything
available (several coalesced input asset events lead to one run). ``upper <= lower``
is a NoOp naming why. Inputs are checked before anything runs: a missing input shard,
or an input whose ``since`` is past ``upper - 1`` (compacted away), is a clear
InvalidUsageError / ReadFrontierError; the output shard is left unchanged.

write: ``correction = desired(upper - 1) - persisted(lower - 1)``, stamped at
``upper - 1`` (:mod:`shardsink.spark.correction`); for a row-wise view whose output was
written by the same definition, equivalently ``V(input changes in [lower, upper))``
(:mod:`shardsink.spark.incremental`). An unchanged view stages nothing (zero parts) and
its append only advances the upper.

**Output schema: from the query, evolving by added columns and widened types.** The
output shard is created by the first successful write job from the query's analysed
schema (every column nullable), at upper = the view's ``initial_upper``, *after* the
correction was staged: a query that fails creates nothing. When the query later gains a
column or widens a type (int8 → int16 → int32 → int64, float → double, a decimal's
precision up at the same scale), the write job evolves the output: it compares in FULL
(the rows persisted before read with nulls in the new column, so every row is
corrected), stages under the evolved schema and, after the query ran, commits the schema
changes through the shard's conditional put (``shardsink log`` shows kind ``schema``,
``shardsink schema URL`` the history), then the batch as usual
(:mod:`shardsink.spark.view_schema`). A view's fingerprint covers the output's schema
id, so no incremental run builds on a basis from another schema. Any other change (a
column dropped or renamed, a narrowed or incompatible type) is refused before any Spark
job (InvalidUsageError naming each column with its old and new type and the commands that
fix it: ``shardsink schema URL --drop NAME`` or ``--rename OLD:NEW``, a CAST in the query,
or a new output shard); the output shard is unchanged.

SUBTLE (racing evolutions): twin write tasks and racing runs plan the same changes from
the same schema; each change is re-validated on the fresh head, so one that a rival
committed first is skipped, not applied twice, and both end at the same schema id. The
schema commit and the batch's append are two commits: between them readers see the old
rows with nulls in the new column, until the batch (or, if it loses its race, the next
run's) corrects them.

SUBTLE (racing runs): two runs may mint the same ``lower``; exactly one commits, the
other loses compare-and-append and re-mints from the new upper. The loser's correction
was computed against a stale ``persisted`` and is discarded, never committed, so the
shard always holds ``desired`` as of the upper of its newest batch. Rows written into
the output by anyone else (a racing writer, a human with the CLI) are retracted by the
next run, because ``persisted`` is read from the shard itself, not remembered.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from shardsink.core.shard import Shard, ShardInfo
from shardsink.errors import InvalidUsageError, ReadFrontierError, ShardNotFoundError
from shardsink.sinks.description import Description, NoOp, make_desc_id
from shardsink.storage.url import parse_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

InputMode = Literal["snapshot", "updates"]
ViewKind = Literal["sql", "python"]
#: A Python view: ``fn(spark, inputs) -> DataFrame``; ``inputs`` maps names to DataFrames.
ViewFunction = Callable[["SparkSession", Mapping[str, "DataFrame"]], "DataFrame"]

#: Default :attr:`View.full_every`: a full comparison at least every 64 runs.
DEFAULT_FULL_EVERY = 64

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class ViewInput:
    """One named input of a view.

    ``mode="snapshot"`` (default): the input's contents as of the view's time, each row
    repeated by its multiplicity (a plain table). ``mode="updates"``: the input's update
    history up to the view's time: user columns + ``_time`` + ``_diff`` (for views over
    event time, e.g. counts per day). HAZARD: compaction advances times ``< since`` to
    ``since``, so an ``updates`` view that groups by ``_time`` changes when the input is
    compacted (the next run corrects the output accordingly).
    """

    url: str
    mode: InputMode = "snapshot"

    def __post_init__(self) -> None:
        if self.mode not in ("snapshot", "updates"):
            raise InvalidUsageError(f"input mode {self.mode!r} is invalid; expected 'snapshot' or 'updates'")
        object.__setattr__(self, "url", str(parse_url(self.url)))


@dataclass(frozen=True)
class View:
    """A view definition: JSON-able (it travels to the spark-submit job as a spec).

    Exactly one of ``sql`` (Spark SQL; each input is a temporary view named by its key)
    or ``function`` (``"module:callable"``, a :data:`ViewFunction` importable on the
    Spark driver) is set. The query must be deterministic: Spark may re-run tasks.

    ``full_every``: a row-wise view is corrected from its input's changes alone while the
    output's newest batches come from the same definition (:mod:`shardsink.spark.incremental`);
    at most ``full_every - 1`` such runs in a row, then one compares the whole view with
    the whole output again. 1: compare in full on every run.
    """

    inputs: Mapping[str, ViewInput]
    sql: str | None = None
    function: str | None = None
    full_every: int = DEFAULT_FULL_EVERY
    kind: ViewKind = field(init=False)

    def __post_init__(self) -> None:
        if (self.sql is None) == (self.function is None):
            raise InvalidUsageError("a view needs exactly one of sql=... or function='module:callable'")
        if not self.inputs:
            raise InvalidUsageError("a view needs at least one input shard")
        bad = [n for n in self.inputs if not _NAME.match(n)]
        if bad:
            raise InvalidUsageError(f"view input names {bad} are invalid; expected SQL identifiers ([A-Za-z_]\\w*)")
        if self.function is not None and ":" not in self.function:
            raise InvalidUsageError(f"view function {self.function!r} is invalid; expected 'module:callable'")
        if isinstance(self.full_every, bool) or not isinstance(self.full_every, int) or self.full_every < 1:
            raise InvalidUsageError(f"full_every={self.full_every!r} is invalid; expected an integer >= 1")
        object.__setattr__(self, "inputs", dict(sorted(self.inputs.items())))
        object.__setattr__(self, "kind", "sql" if self.sql is not None else "python")

    def spec(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "inputs": {n: {"url": i.url, "mode": i.mode} for n, i in self.inputs.items()},
            **({"sql": self.sql} if self.sql is not None else {"function": self.function}),
            **({"full_every": self.full_every} if self.full_every != DEFAULT_FULL_EVERY else {}),
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> View:
        try:
            inputs = {str(n): ViewInput(str(i["url"]), i.get("mode", "snapshot")) for n, i in spec["inputs"].items()}
            return cls(inputs, sql=spec.get("sql"), function=spec.get("function"),
                       full_every=spec.get("full_every", DEFAULT_FULL_EVERY))
        except (KeyError, TypeError, AttributeError) as e:
            raise InvalidUsageError(f"view spec {dict(spec)!r} is malformed: {e}") from e

    def load_function(self) -> ViewFunction:
        """Import the Python view function (InvalidUsageError naming it if that fails)."""
        assert self.function is not None
        mod, _, name = self.function.partition(":")
        try:
            obj: Any = importlib.import_module(mod)
            for attr in name.split("."):
                obj = getattr(obj, attr)
        except (ImportError, AttributeError) as e:
            raise InvalidUsageError(f"view function {self.function!r} cannot be imported: {e}") from e
        if not callable(obj):
            raise InvalidUsageError(f"view function {self.function!r} is not callable")
        fn: ViewFunction = obj
        return fn


def view(*, inputs: Mapping[str, str | ViewInput], sql: str | None = None,
         function: str | ViewFunction | None = None, full_every: int = DEFAULT_FULL_EVERY) -> View:
    """Build a :class:`View`; inputs may be plain URLs (snapshot mode), a function a callable."""
    ins = {n: i if isinstance(i, ViewInput) else ViewInput(i) for n, i in inputs.items()}
    if function is not None and not isinstance(function, str):
        function = f"{function.__module__}:{function.__qualname__}"
    return View(ins, sql=sql, function=function, full_every=full_every)


@dataclass(frozen=True)
class InputFrontier:
    """An input shard's frontiers when it was looked at (upper ``None``: closed)."""

    name: str
    url: str
    upper: int | None
    since: int


def input_frontiers(v: View) -> list[InputFrontier]:
    """The frontiers of every input (one head read each); InvalidUsageError naming an input that
    does not exist."""
    out = []
    for name, inp in v.inputs.items():
        try:
            info = Shard(inp.url).info()
        except ShardNotFoundError as e:
            raise ShardNotFoundError(f"view input {name!r} names no shard: {inp.url} ({e})") from e
        out.append(InputFrontier(name, inp.url, info.upper, info.since))
    return out


def open_output(output_url: str) -> Shard | None:
    """The output shard, or None before the first write created it."""
    try:
        return Shard.open(output_url)
    except ShardNotFoundError:
        return None


def output_info(output_url: str) -> ShardInfo | None:
    """The output shard's head (one read), or None before the first write created it."""
    try:
        return Shard(output_url).info()
    except ShardNotFoundError:
        return None


def mint_view(
    v: View,
    *,
    output_url: str,
    initial_upper: int,
    interval_end: int | None,
    max_span: int | None,
    dag_id: str,
    run_id: str,
    attempt: int,
    frontiers: Sequence[InputFrontier] | None = None,
) -> Description | NoOp:
    """Mint the next batch of the view (see the module docstring); reads state only, no JVM:
    the output's head once and, unless the caller read them already (``frontiers``), each
    input's head once."""
    out = output_info(output_url)
    lower = initial_upper if out is None else out.upper
    frontiers = input_frontiers(v) if frontiers is None else frontiers
    uppers = [f.upper for f in frontiers if f.upper is not None]
    inputs_upper = min(uppers) if uppers else None
    if lower is None:
        return NoOp(f"output shard {output_url} is closed; nothing can be appended", None, inputs_upper,
                    interval_end)
    bounds = [b for b in (inputs_upper, interval_end, None if max_span is None else lower + max_span)
              if b is not None]
    upper = min(bounds) if bounds else lower
    where = ", ".join(f"{f.name} upper {f.upper}" for f in frontiers)
    if upper <= lower:
        why = "no input has advanced past the view's upper" if inputs_upper is None or inputs_upper <= lower \
            else "the run's interval ends at or before the view's upper"
        return NoOp(
            f"nothing to do: {why} (output upper {lower}, inputs: {where}, interval end {interval_end}, "
            f"max span {max_span})",
            lower, inputs_upper, interval_end,
        )
    for f in frontiers:
        if upper - 1 < f.since:
            raise ReadFrontierError(
                f"view input {f.name!r} ({f.url}) cannot be read as of {upper - 1}: its since is {f.since} "
                f"(times before it were compacted); the output {output_url} was not changed"
            )
    return Description(make_desc_id(dag_id, run_id, attempt), lower, upper, attempt)
