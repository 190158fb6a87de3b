"""The materialize sink's write step on Spark: desired contents, correction, staging, manifest.

::

    write_view(spark, view, output_url=URL, desc=desc)   # -> summary dict

Everything that touches data happens inside ONE :class:`ShardReads` block: the inputs
are read as of ``desc.upper - 1`` and the output as of ``desc.lower - 1`` under leases,
and ``stage_dataframe`` runs there too (DataFrames are lazy; an action after the block
would run unprotected). The staged parts are then published with the ingest sink's
manifest (one slot: the correction is a single Spark job, parallel inside Spark), so
the append step is the ingest sink's, unchanged.

Evolving output (:mod:`shardsink.spark.view_schema`): when the query's output gains a column
or widens a type, the run compares in full against the persisted rows as read under the
evolved schema, stages its parts under that schema, and only then, after the query ran,
commits the schema changes (:func:`shardsink.spark.view_schema.evolve_output`) before it
writes the manifest, which records the evolved schema id. SUBTLE: the schema commit and the
batch's append are two commits: between them (or if the append then loses its race) readers
see the old rows with nulls in the new column; the batch that commits, or the next run's,
corrects them.

Reads (each fact once per task): the output's state version comes from the write
task's fate decision (``decided_at``, fetched as an immutable version) or ONE head read; each
input's head is read once (:class:`Facts`); both are passed down (``at=``/``head=``/``heads=``).
The leased reads add what the lease protocol needs (:mod:`shardsink.core.leases`: the checks
around the lease's write, and the version pinned after it).

Errors: a query Spark refuses at analysis (bad SQL, unknown column/table) or a schema
the output cannot evolve to (:mod:`shardsink.spark.view_schema`: only added nullable columns
and widened types evolve it) is InvalidUsageError, raised before any job and before
anything is written. A failure at run time (e.g. ``raise_error`` in the query) fails the
Spark job; staged leftovers live under the description's prefix and are deleted by the
append step once the description's fate is known (see :mod:`shardsink.sinks.ingest`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardsink.core.fate import Committed
from shardsink.core.schema import current as current_schema
from shardsink.core.schema import id_of
from shardsink.core.shard import AppendResult, Shard
from shardsink.core.state import Version
from shardsink.core.updates import DIFF, TIME
from shardsink.errors import InvalidUsageError, ShardExistsError, ShardNotFoundError
from shardsink.sinks.description import Description, NoOp
from shardsink.sinks.ingest import committed
from shardsink.sinks.materialize import View
from shardsink.sinks.staging import write_manifest
from shardsink.spark import incremental, view_schema
from shardsink.spark.correction import (
    check_desired_schema,
    correction_frame,
    incremental_correction,
    linear_correction,
)
from shardsink.spark.incremental import BASIS, FINGERPRINT, RUN, Basis
from shardsink.spark.linear import RowWiseView, row_wise_view, signed_views
from shardsink.spark.read import ShardReads
from shardsink.spark.stage import stage_dataframe
from shardsink.spark.view_schema import Evolution, output_schema
from shardsink.storage.retry import RetryPolicy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: :func:`refresh_view`'s fresh runs after lost races: jittered, bounded by ``max_attempts``
#: (its ``attempts``), not by time (one attempt is a Spark job).
REFRESH = RetryPolicy("view-refresh", attempts=5, first_wait=0.1, max_wait=2.0, deadline=math.inf)


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What one view write works from, each read once: ``output``, the output shard's state
    version (None: no output shard yet) and ``inputs``, each input shard's head by URL."""

    output: Version | None
    inputs: Mapping[str, Version]


def input_heads(v: View) -> dict[str, Version]:
    """Each input shard's head by URL (one read each); ShardNotFoundError naming a missing input."""
    heads: dict[str, Version] = {}
    for name, inp in v.inputs.items():
        if inp.url not in heads:
            try:
                heads[inp.url] = Shard(inp.url).reader().head()
            except ShardNotFoundError as e:
                raise ShardNotFoundError(f"view input {name!r} names no shard: {inp.url} ({e})") from e
    return heads


def output_facts(output_url: str, desc: Description, *,
                 decided_at: int | None = None) -> tuple[Version | None, Committed | None]:
    """The output's state version a write works from (None: no output shard yet), and the
    commit of ``desc`` if it landed. ``decided_at``: the version at which the task already
    decided ``desc`` may still commit (fetched, immutable: no head read, no second decision;
    :class:`~shardsink.spark.request.ViewWriteRequest`); else (or if GC collected it) ONE
    head read, from which the fate is decided."""
    shard = Shard(output_url)
    if decided_at is not None:
        got = shard.reader().version(decided_at)
        if got is not None:
            return got, None
    try:
        head = shard.reader().head()
    except ShardNotFoundError:
        return None, None
    return head, committed(shard, desc, head=head)


def read_facts(v: View, output_url: str) -> Facts:
    """:class:`Facts` from fresh reads: the output's head (or None) and each input's head."""
    try:
        out: Version | None = Shard(output_url).reader().head()
    except ShardNotFoundError:
        out = None
    return Facts(output=out, inputs=input_heads(v))


def _head(heads: Mapping[str, Version] | None, url: str) -> Version:
    """The head of ``url`` from ``heads`` (read once by the caller), else one read."""
    got = heads.get(url) if heads is not None else None
    return got if got is not None else Shard(url).reader().head()


def desired_frame(reads: ShardReads, v: View, *, as_of: int,
                  heads: Mapping[str, Version] | None = None) -> tuple[DataFrame, list[dict[str, Any]]]:
    """The view's contents as of ``as_of`` (lazy) and a JSON-able list of what it reads.
    ``heads``: the inputs' heads by URL as the caller read them (:func:`input_heads`).

    Raises InvalidUsageError if Spark refuses the query at analysis, naming the cause.
    """
    heads = input_heads(v) if heads is None else heads
    frames: dict[str, DataFrame] = {}
    for name, inp in v.inputs.items():
        at = _head(heads, inp.url)
        if inp.mode == "snapshot":
            frames[name] = reads.snapshot(inp.url, as_of, repeat=True, at=at)
        else:
            frames[name] = reads.changes(inp.url, at.header.since, as_of + 1, at=at)
    return run_view(reads.spark, v, frames), inputs_read(v, as_of=as_of, heads=heads)


def inputs_read(v: View, *, as_of: int, heads: Mapping[str, Version] | None = None) -> list[dict[str, Any]]:
    """What a run of ``v`` as of ``as_of`` reads, JSON-able (recorded in the manifest).
    ``heads``: as for :func:`desired_frame` (an ``updates`` input's since comes from it)."""
    inputs: list[dict[str, Any]] = []
    for name, inp in v.inputs.items():
        if inp.mode == "snapshot":
            inputs.append({"name": name, "url": inp.url, "mode": inp.mode, "as_of": as_of})
        else:
            since = _head(heads, inp.url).header.since
            inputs.append({"name": name, "url": inp.url, "mode": inp.mode, "from": since, "to": as_of + 1})
    return inputs


def run_view(spark: SparkSession, v: View, frames: dict[str, DataFrame]) -> DataFrame:
    """The view's query over named input frames (lazy), analysed here, on the driver.

    Raises InvalidUsageError if Spark refuses the query at analysis, naming the cause.
    """
    from pyspark.errors import AnalysisException

    try:
        if v.sql is not None:
            for name, df in frames.items():
                df.createOrReplaceTempView(name)
            desired = spark.sql(v.sql)
        else:
            desired = v.load_function()(spark, frames)
        desired.schema  # noqa: B018 - forces analysis here, on the driver, before any job
    except AnalysisException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidUsageError(f"the view query failed in Spark: {first}") from e
    return desired


def _create_output(url: str, schema: pa.Schema, desired: DataFrame, *, upper: int) -> Shard:
    """Create the output shard; a racing creator's shard is accepted only with the same schema,
    else InvalidUsageError. SUBTLE: the parts staged against our schema are then left in place:
    the description may still commit in principle (its lower is the shard's upper), so only GC
    collects them once the upper has moved past (see :mod:`shardsink.core.fate`)."""
    try:
        return Shard.create(url, schema, upper=upper)
    except ShardExistsError:
        shard = Shard(url)
        check_desired_schema(desired, shard.reader().head().header.schema, where=shard.url)
        return shard


@dataclass(frozen=True, kw_only=True)
class ViewCorrection:
    """A run's correction (lazy; stage it inside the ``ShardReads`` block), the output
    schema, the inputs read (JSON-able) and how it was computed: ``basis`` and the props
    its commit records (:mod:`shardsink.spark.incremental`). ``evolution``: the schema
    changes the output needs first (``schema`` is then their target), committed by
    :func:`write_view` after staging; ``definition``: the view's definition fingerprint."""

    frame: DataFrame
    schema: pa.Schema
    inputs: list[dict[str, Any]]
    basis: Basis
    props: dict[str, str]
    evolution: Evolution | None = None
    definition: str | None = None

    def props_for(self, schema_id: int) -> dict[str, str]:
        """The props the commit records, its parts written under ``schema_id``: the plan's, or
        after an evolution a full run's, fingerprinted under the evolved schema id."""
        if self.evolution is None:
            return self.props
        fp = incremental.output_fingerprint(self.definition, schema_id)
        return {} if fp is None else {FINGERPRINT: fp, BASIS: "full", RUN: "0"}


def correct_view(reads: ShardReads, v: View, *, output_url: str, desc: Description,
                 facts: Facts | None = None) -> ViewCorrection:
    """The correction of ``desc``. Shared by the write job and dry runs (:mod:`shardsink.spark.dryrun`).

    A row-wise view of one input is corrected from its input's changes in ``desc`` when
    the output's newest batch comes from the same definition
    (:mod:`shardsink.spark.incremental`), else in one aggregation over its raw input
    updates and the output (:mod:`shardsink.spark.linear`); every other view through its
    desired contents. ``facts``: the output's version and the inputs' heads the caller
    read (:func:`output_facts`, :func:`input_heads`); None: read here, once each.
    """
    facts = read_facts(v, output_url) if facts is None else facts
    as_of = desc.upper - 1
    run = functools.partial(run_view, reads.spark, v)
    rw = row_wise_view(reads.spark, v, run=run, heads=facts.inputs)
    if rw is not None:
        return _row_wise_correction(reads, v, rw, output_url=output_url, desc=desc, facts=facts)
    desired, inputs = desired_frame(reads, v, as_of=as_of, heads=facts.inputs)
    at = facts.output
    if at is None:
        schema = output_schema(desired)
        corr = correction_frame(desired, None, schema=schema, upper=desc.upper, where=output_url)
        return ViewCorrection(frame=corr, schema=schema, inputs=inputs, basis="full", props={})
    out = Shard(output_url)
    evo = view_schema.evolution(output_schema(desired), at.header, url=out.url)
    schema = at.header.schema if evo is None else evo.target
    persisted = _persisted(reads, out, at, lower=desc.lower)
    if evo is not None:  # a full comparison against the rows as read under the evolved schema
        persisted = view_schema.projected_persisted(persisted, evo.target)
    corr = correction_frame(desired, persisted, schema=schema, upper=desc.upper, where=out.url)
    return ViewCorrection(frame=corr, schema=schema, inputs=inputs, basis="full", props={}, evolution=evo)


def _row_wise_correction(reads: ShardReads, v: View, rw: RowWiseView, *, output_url: str, desc: Description,
                         facts: Facts) -> ViewCorrection:
    """:func:`correct_view` of a row-wise view: incremental if its basis holds, else linear."""
    as_of = desc.upper - 1
    run = functools.partial(run_view, reads.spark, v)
    at = facts.output
    out = None if at is None else Shard(output_url)
    input_at = facts.inputs.get(rw.url)
    evo = None if at is None else view_schema.evolution(
        view_schema.probe_schema(reads.spark, rw.name, rw.url, run=run, at=input_at), at.header, url=output_url)
    fp = incremental.output_fingerprint(rw.fingerprint, 0 if at is None else current_schema(at.header).id)
    how = incremental.RunBasis(basis="full", props={}) if evo is not None else incremental.choose_basis(
        reads, v, fp=fp, output=out, input_url=rw.url, lower=desc.lower, head=at)
    if how.basis == "incremental":
        assert out is not None and at is not None
        changes = reads.changes(rw.url, desc.lower, desc.upper, consolidate=False, at=input_at)
        positive, negative = signed_views(rw, changes, run=run)
        corr = incremental_correction(positive, negative, schema=at.header.schema, upper=desc.upper, where=out.url)
        inputs = [{**i, "changes_from": desc.lower} for i in inputs_read(v, as_of=as_of, heads=facts.inputs)]
        return ViewCorrection(frame=corr, schema=at.header.schema, inputs=inputs, basis=how.basis, props=how.props)
    positive, negative = signed_views(rw, reads.updates(rw.url, as_of, at=input_at), run=run)
    schema = output_schema(positive) if at is None else at.header.schema if evo is None else evo.target
    persisted = None if out is None or at is None else _persisted(reads, out, at, lower=desc.lower)
    if evo is not None:  # a full comparison against the rows as read under the evolved schema
        persisted = view_schema.projected_persisted(persisted, evo.target)
    inputs_where = ", ".join(f"input shard {i.url} as of {as_of}" for i in v.inputs.values())
    corr = linear_correction(positive, negative, persisted, schema=schema, upper=desc.upper,
                             where=output_url if out is None else out.url, inputs_where=inputs_where)
    return ViewCorrection(frame=corr, schema=schema, inputs=inputs_read(v, as_of=as_of, heads=facts.inputs),
                          basis=how.basis, props=how.props, evolution=evo, definition=rw.fingerprint)


def _persisted(reads: ShardReads, out: Shard, at: Version, *, lower: int) -> DataFrame | None:
    """The output's raw updates as of ``lower - 1`` (leased; frontiers and schema from ``at``),
    or None if no batch at ``at`` covers a time before ``lower`` (nothing persisted yet).
    As :func:`shardsink.spark.correction.persisted_updates`, from the version the task works from."""
    if any(b.lower < lower for b in out.reader().batches(at)):
        return reads.updates(out.url, lower - 1, at=at)
    return None


def write_view(spark: SparkSession, v: View, *, output_url: str, desc: Description,
               holder: str | None = None, decided_at: int | None = None) -> dict[str, Any]:
    """Stage the correction of ``desc`` and publish its manifest (slot 0 of 1); return a summary.

    Returns status ``already_committed`` without reading anything else if ``desc`` landed
    already. The output shard is created here on the first run (module docstring of
    :mod:`shardsink.sinks.materialize`). ``decided_at``: the output's state version at which
    the write task decided ``desc`` may still commit (:func:`output_facts`): the write then
    reads no head of the output; else one head read decides.
    """
    t0 = time.monotonic()
    at, done = output_facts(output_url, desc, decided_at=decided_at)
    if done is not None:
        return {"status": "already_committed", "seqno": done.seqno, "slot": 0}
    facts = Facts(output=at, inputs=input_heads(v))
    with ShardReads(spark, holder=holder or f"view-write:{desc.desc_id}") as reads:
        c = correct_view(reads, v, output_url=output_url, desc=desc, facts=facts)
        # A correction is a small, sparse set of rows: compact parts (zstd, selective dictionaries).
        parts = stage_dataframe(c.frame, shard_url=output_url, schema=c.schema, lower=desc.lower,
                                upper=desc.upper, desc_id=desc.desc_id, encoding="compact", at=at)
    # SUBTLE: created (or evolved) only now, after the query ran: a failing query leaves the
    # output as it was.
    out = Shard(output_url) if at is not None else _create_output(output_url, c.schema, c.frame.drop(TIME, DIFF),
                                                                   upper=desc.lower)
    # The schema id the parts were written with: that of ``at`` (whose schema c.schema is), of
    # c.schema once the output evolved to it, or for a shard created just now (or by a racing
    # creator, checked equal) the id of c.schema.
    if at is None:
        schema_id = id_of(out.reader().head().header, c.schema)
    elif c.evolution is not None:
        schema_id = view_schema.evolve_output(out, c.evolution, at=at, writer=holder or f"view-write:{desc.desc_id}")
    else:
        schema_id = current_schema(at.header).id
    # SUBTLE: the props (the basis the next run builds on) travel in the manifest with the
    # parts they describe: a twin attempt's manifest replaces both at once.
    props = c.props if schema_id is None else c.props_for(schema_id)
    doc = write_manifest(out, desc, slot=0, slots=1, parts=parts, inputs=c.inputs, props=props,
                         schema_id=schema_id)
    return {"status": "staged", "slot": 0, "parts": len(parts), "rows": doc["rows"], "basis": c.basis,
            "bytes": sum(p.bytes for p in parts), "seconds": round(time.monotonic() - t0, 2),
            **({"evolved": c.evolution.describe(), "schema_id": schema_id} if c.evolution is not None else {})}


def refresh_view(spark: SparkSession, v: View, *, output_url: str, initial_upper: int = 0,
                 interval_end: int | None = None, max_span: int | None = None, max_attempts: int = 5,
                 name: str = "view", run_id: str = "inline") -> AppendResult | NoOp:
    """mint → write → append in this process (no Airflow): one run of the view, with fresh
    descriptions after lost races (up to ``max_attempts``; the last LostRaceError propagates).

    For notebooks, scripts, tests and benchmarks; the Airflow DAG runs the same three steps.
    Lost races back off by :data:`REFRESH` (full jitter) before the next fresh mint.
    """
    from shardsink.sinks.append import LostRaceError, append_from_manifests
    from shardsink.sinks.materialize import mint_view

    attempts = itertools.count(1)

    def one_run() -> AppendResult | NoOp:
        desc = mint_view(v, output_url=output_url, initial_upper=initial_upper, interval_end=interval_end,
                         max_span=max_span, dag_id=name, run_id=run_id, attempt=next(attempts))
        if isinstance(desc, NoOp):
            return desc
        write_view(spark, v, output_url=output_url, desc=desc)
        # No read here: the append's fate read is its one head read.
        return append_from_manifests(Shard(output_url), desc, 1, writer=f"{name}/{run_id}")

    policy = dataclasses.replace(REFRESH, attempts=max_attempts)
    return policy.call(one_run, retry_on=lambda e: isinstance(e, LostRaceError))
