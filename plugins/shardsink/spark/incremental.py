"""Incremental correction of row-wise views: the batch from the input's changes alone.

A view run's correction is ``desired(upper - 1) - persisted(lower - 1)``
(:mod:`shardsink.spark.correction`). For a row-wise view ``V`` of one input ``I``
(:mod:`shardsink.spark.linear`: linear over multisets) and an output that already holds
``V(I(lower - 1))`` as of ``lower - 1``, that is

    V(I(upper - 1)) - V(I(lower - 1)) = V(updates of I with lower <= _time < upper)

so the run reads only the input's new updates: neither the whole input nor the output.
This is what Materialize's persist sink does in steady state (it corrects with the
desired and persisted *updates*; a full comparison only on restart).

**When the premise holds (the basis).** Every view run records in its commit
(:attr:`shardsink.core.commits.AppendCommit.props`) the fingerprint of its definition and
how many incremental runs in a row led to it. A run goes incremental iff

* the view is row-wise, without a UDF (a UDF's code is not in the plan we fingerprint);
* walking back from the output's head over commits that keep its contents (compaction,
  ``since``, retention), the first other commit is an append whose upper is the run's
  ``lower`` and that carries the same fingerprint: a run of this very definition left
  the output equal to ``V(I(lower - 1))``. Anything else (the shard's creation, an
  append by someone else, a changed definition, a version GC removed) is no basis;
* fewer than ``View.full_every - 1`` incremental runs led to it;
* a lease at ``lower - 1`` holds on the input (``since < lower``: compaction has not
  advanced older updates into ``[lower, upper)``, and cannot while the run reads).

Otherwise the run compares in full (and the count restarts). By induction every append
carrying fingerprint ``F`` leaves the output equal to ``V_F`` of its input.

The fingerprint hashes the analysed plan of the view over an empty frame of the input's
schema (expression ids removed), that schema, the input's URL and mode, the Spark version,
the session time zone and ANSI mode, and the output's schema id (:func:`output_fingerprint`):
a change to any of them forces a full comparison.

HAZARDS: an input shard deleted and re-created at the same URL is not noticed (run the
view once with ``full_every=1``; README, views). An incremental run cannot tell a corrupt
input retraction (a negative multiplicity) from a legitimate one; the next full
comparison reports it as a negative multiplicity of the output.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shardsink.core.commits import AppendCommit
from shardsink.core.shard import Shard
from shardsink.errors import ReadFrontierError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from shardsink.core.commits import Commit
    from shardsink.core.state import Version
    from shardsink.sinks.materialize import View
    from shardsink.spark.read import ShardReads

Basis = Literal["full", "incremental"]

#: Commit props a view run records (:attr:`shardsink.core.commits.AppendCommit.props`).
FINGERPRINT, BASIS, RUN = "view.fingerprint", "view.basis", "view.incremental_run"
#: Commits that leave a shard's contents (at times >= since) as they were.
#: How far back past such commits a run looks for the append that set its lower.
_LOOK_BACK = 16
_EXPR_ID = re.compile(r"#\d+")


@dataclass(frozen=True, kw_only=True)
class RunBasis:
    """How a run corrects: ``basis``, and the props its commit records."""

    basis: Basis
    props: dict[str, str]


def fingerprint(shaped: DataFrame, v: View, *, input_schema: str) -> str | None:
    """The definition fingerprint of a row-wise view (``shaped`` = the view over its probe
    frame), or None if its plan holds a UDF (module docstring)."""
    analyzed = shaped._jdf.queryExecution().analyzed()
    if "UDF" in analyzed.toJSON():
        return None
    spark = shaped.sparkSession
    (name, inp), = v.inputs.items()
    parts = [
        _EXPR_ID.sub("", analyzed.toString()), input_schema, f"{name}={inp.url} ({inp.mode})",
        f"spark {spark.version}", f"tz {spark.conf.get('spark.sql.session.timeZone')}",
        f"ansi {spark.conf.get('spark.sql.ansi.enabled')}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def output_fingerprint(definition: str | None, schema_id: int) -> str | None:
    """The fingerprint a run compares and records: the view's :func:`fingerprint` covering the
    output's schema id (the schema its batch's parts are written with). After the output
    evolves (:mod:`shardsink.spark.view_schema`) no run builds on a basis computed under an
    older schema. Schema 0 (a shard that never evolved) keeps the definition's fingerprint, so
    outputs written before schema evolution keep their basis."""
    if definition is None:
        return None
    if schema_id == 0:
        return definition
    return hashlib.sha256(f"{definition}\noutput schema {schema_id}".encode()).hexdigest()[:32]


def choose_basis(reads: ShardReads, v: View, *, fp: str | None, output: Shard | None, input_url: str,
                 lower: int, head: Version | None = None) -> RunBasis:
    """Decide the basis of the run ``[lower, ...)`` (module docstring).

    Incremental only: a lease at ``lower - 1`` on the input is then held by ``reads``.
    ``head``: the output's state version the caller works from (e.g. the one its write task
    decided the fate at; a newer commit that changes the contents makes the run lose at
    append anyway), else one head read of ``output``.
    """
    if fp is None:
        return RunBasis(basis="full", props={})
    full = RunBasis(basis="full", props={FINGERPRINT: fp, BASIS: "full", RUN: "0"})
    if output is None or v.full_every <= 1:
        return full
    prior = _content_commit(output, head=head)
    if not isinstance(prior, AppendCommit) or prior.upper != lower:
        return full
    props = dict(prior.props)
    if props.get(FINGERPRINT) != fp:
        return full
    run = int(props.get(RUN, "0")) + 1 if props.get(BASIS) == "incremental" else 1
    if run >= v.full_every:
        return full
    try:
        reads.keeper.acquire(Shard(input_url), lower - 1, holder=reads.holder)  # the lease reads the head
    except ReadFrontierError:  # the input was compacted past lower - 1
        return full
    return RunBasis(basis="incremental", props={FINGERPRINT: fp, BASIS: "incremental", RUN: str(run)})


def _content_commit(shard: Shard, *, head: Version | None = None) -> Commit | None:
    """The newest commit of ``shard`` that may have changed its contents, or None if it
    is further back than :data:`_LOOK_BACK` commits or its version is gone. ``head``: the
    version to walk back from (else one head read)."""
    reader = shard.reader()
    head = head if head is not None else reader.head()
    for seqno in range(head.seqno, max(-1, head.seqno - _LOOK_BACK), -1):
        version = head if seqno == head.seqno else reader.version(seqno)
        if version is None:
            return None
        if version.commit.changes_contents:
            return version.commit
    return None
