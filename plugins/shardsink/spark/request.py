"""Typed spark-submit requests: what a write task asks its job to do, mirroring the outcome.

A shardsink spark-submit job gets ONE :data:`JobRequest` (msgspec JSON, one
``--request`` argument) and answers with ONE :class:`shardsink.outcome.JobOutcome`
(``--result-path``). The write operators build requests with :func:`job_argv` (the one
encoder); ``spark_jobs/*.py`` read them with :func:`decode_request` (the one decoder) and
call the library. The union is tagged by ``job``:

* :class:`IngestWriteRequest` (``spark_jobs/ingest_write.py``): one slot of a description;
* :class:`IngestCorrectRequest` (``spark_jobs/ingest_correct.py``): a re-processing
  description (it carries ``corrects``), whole, as slot 0 of 1;
* :class:`ViewWriteRequest` (``spark_jobs/view_write.py``): a view's description.

A request holds no secrets: the source spec names locations and settings only
(:mod:`shardsink.specs`), the view spec a query and input shard URLs; credentials reach
the job through its environment. A request that does not decode, has a newer format, or
is sent to the wrong job is an InvalidUsageError naming the field (exit 2, no retries).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from shardsink.core.state import PartOrder
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import Description
from shardsink.sources.evolution import SchemaMode
from shardsink.specs import SourceSpec

FORMAT = "shardsink.job-request/1"
#: The option that carries the request on the job's command line.
REQUEST_OPTION = "--request"


class RequestBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="job"):
    """Every request: its format, the shard it writes and the description it stages."""

    format: str = FORMAT
    shard_url: str
    desc: Description


class IngestWriteRequest(RequestBase, frozen=True, kw_only=True, tag="ingest_write"):
    """Stage slot ``slot`` of ``slots`` of ``desc`` from ``source``, as ``part_order`` parts
    (:data:`shardsink.core.state.PartOrder`; a request without it, from an older operator,
    stages sorted parts).

    ``decided_at``: the seqno of the state version at which the write task already decided
    that ``desc`` may still commit (the operator's one head read); the job then reads that
    immutable version for the schema and the seals instead of the head, and does not decide
    the fate again. SUBTLE: safe although the version may be seconds old: a twin's commit
    of ``desc`` meanwhile only makes this slot's parts leftovers that the append deletes
    (never referenced), and a rival's commit past ``desc.lower`` makes ``desc`` lose at
    append whatever the job staged. None: the job reads the head and decides itself.
    """

    source: SourceSpec
    slot: int
    slots: int
    part_order: PartOrder = "sorted"
    decided_at: int | None = None
    #: How the slot reads files onto the shard's schema (:mod:`shardsink.sources.evolution`); a
    #: request without it (an older operator) reads strictly, which refuses rather than loses a column.
    schema_mode: SchemaMode = "strict"


class IngestCorrectRequest(RequestBase, frozen=True, kw_only=True, tag="ingest_correct"):
    """Stage the correcting description ``desc`` (``desc.corrects`` is set) whole."""

    source: SourceSpec
    slot: int = 0
    slots: int = 1
    #: As :attr:`IngestWriteRequest.schema_mode`: the ordinary rows and the re-read range are read
    #: onto the shard's schema so (a request without it, from an older operator, reads strictly).
    schema_mode: SchemaMode = "strict"


class ViewWriteRequest(RequestBase, frozen=True, kw_only=True, tag="view_write"):
    """Stage ``desc`` of the view ``view`` (``shardsink.sinks.materialize.View.spec()``).

    ``decided_at``: the seqno of the OUTPUT shard's state version at which the write task
    already decided that ``desc`` may still commit (the operator's one head read); the job
    then works from that immutable version (schema, basis, persisted batches) instead of the
    head, and does not decide the fate again. SUBTLE: safe although the version may be
    seconds old, as for :class:`IngestWriteRequest`: a twin's commit of ``desc`` meanwhile
    only makes the staged parts leftovers that the append deletes, and any other commit that
    changes the output's contents moves its upper past ``desc.lower``, so ``desc`` loses at
    append whatever the job staged (commits that keep the contents, e.g. compaction, leave
    the correction exact). The persisted rows themselves are read under a lease, from a
    version read after it. None: the job reads the head and decides itself.
    """

    view: dict[str, Any]
    decided_at: int | None = None


JobRequest = IngestWriteRequest | IngestCorrectRequest | ViewWriteRequest
R = TypeVar("R", IngestWriteRequest, IngestCorrectRequest, ViewWriteRequest)

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(JobRequest)


class _Format(msgspec.Struct):
    format: Any = None


def encode_request(req: JobRequest) -> str:
    """The request as canonical JSON text (one command-line argument)."""
    return _encoder.encode(req).decode()


def job_argv(req: JobRequest, *, result_path: str | None = None) -> list[str]:
    """The job's arguments: the request, and where it writes its outcome record."""
    out = [REQUEST_OPTION, encode_request(req)]
    return [*out, "--result-path", result_path] if result_path is not None else out


def decode_request(text: str | bytes, kind: type[R]) -> R:
    """The request ``text`` holds, which must be a ``kind``; InvalidUsageError naming the
    field otherwise (a missing or mistyped field, a newer format, another job's request)."""
    data = text.encode() if isinstance(text, str) else text
    try:
        fmt = msgspec.json.decode(data, type=_Format).format
    except msgspec.DecodeError as e:
        raise InvalidUsageError(f"spark-submit request is not JSON: {e}") from e
    if fmt != FORMAT:
        raise InvalidUsageError(f"spark-submit request: unsupported format {fmt!r} - at `$.format` (this job "
                                f"reads {FORMAT!r}; deploy the same shardsink on the workers and the Spark side)",
                                value=str(fmt))
    try:
        req = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InvalidUsageError(f"spark-submit request: {e}") from e
    if not isinstance(req, kind):
        want = kind.__struct_config__.tag
        got = type(req).__struct_config__.tag
        raise InvalidUsageError(f"spark-submit request: job {got!r} sent to the {want!r} application - at `$.job`",
                                value=str(got))
    _check(req)
    return req


def _check(req: JobRequest) -> None:
    """What the types cannot say, named by field."""
    if isinstance(req, IngestCorrectRequest) and req.desc.corrects is None:
        raise InvalidUsageError("spark-submit request: a correction job needs a description that corrects a "
                                "range - at `$.desc.corrects`")
    if isinstance(req, IngestWriteRequest | ViewWriteRequest) and req.decided_at is not None \
            and not 0 <= req.decided_at < 2**63:
        raise InvalidUsageError(f"spark-submit request: decided_at {req.decided_at} is not a seqno in [0, 2^63) - "
                                "at `$.decided_at`", value=str(req.decided_at))
    if isinstance(req, IngestWriteRequest | IngestCorrectRequest) and not 0 <= req.slot < req.slots:
        raise InvalidUsageError(f"spark-submit request: slot {req.slot} is not in [0, {req.slots}) - at `$.slot`",
                                value=str(req.slot))
