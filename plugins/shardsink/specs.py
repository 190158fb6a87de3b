"""Source specs as data: a tagged union of msgspec structs, one per source kind.

A spec names locations and settings, never secrets (credentials come from the
environment of the process that reads). It travels from the DAG file to the Airflow
tasks (a plain dict: mapped operators' arguments are serialized), inside the
spark-submit request (:mod:`shardsink.spark.request`, typed) and into the reclock
sidecar of every data shard (:mod:`shardsink.reclock.health`, typed).

The JSON layout of a built-in kind IS its tagged encoding: ``{"kind": "landing", "root":
..., ...}``; defaults are omitted, so specs written before these structs (every key
present) and after (defaults left out) both decode, and older readers (which default
every optional key) read what this one writes.

Kinds registered at run time (``register_kind``, or ``"module:Class"``) are carried as
:class:`CustomSpec`: their dict layout ``{"kind": "module:Class", ...}`` converts to
``CustomSpec(target="module:Class", options={...})`` and back (:func:`spec_from_builtins`,
:func:`spec_to_builtins`); inside a typed document it encodes with the tag ``"custom"``.

This module sits beside :mod:`shardsink.outcome` (it imports only msgspec and
:mod:`shardsink.errors`), so ``sources/``, ``reclock/`` and ``spark/`` all build on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import msgspec

from shardsink.errors import InvalidUsageError

Probe = Literal["fetch", "end_offsets"]


class SpecBase(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Every spec: tagged by ``kind``, default values left out of the encoding."""


class RoutedSpec(SpecBase, frozen=True, kw_only=True, omit_defaults=True):
    """A reclocked source's remap shard and routing (``shardsink.reclock.source.Routing``)."""

    remap: str
    outputs: dict[str, str] | None = None
    route_by: str | None = None
    output: str | None = None


class LandingSpec(SpecBase, frozen=True, kw_only=True, omit_defaults=True, tag="landing"):
    """``shardsink.sources.landing.LandingSource``. ``schema``: ``schema_to_json`` of the user
    columns; ``columns``: ``{"name": "int64", ...}`` (pyarrow aliases), accepted on input.
    ``partitions`` (``"dt=YYYY-MM-DD"`` or ``"YYYY/MM/DD"``) and ``lateness`` (a duration such as
    ``"2d"``): a declared time-partitioned layout (:mod:`shardsink.sources.landing.partitions`)."""

    root: str
    time_column: str = "event_time"
    schema: dict[str, Any] | None = None
    columns: dict[str, str] | None = None
    partitions: str | None = None
    lateness: str | None = None


class FilesSpec(RoutedSpec, frozen=True, kw_only=True, omit_defaults=True, tag="files"):
    """``shardsink.sources.files.FileArrivals``."""

    root: str
    settle_seconds: float = 30.0
    schema: dict[str, Any] | None = None
    columns: dict[str, str] | None = None


class KafkaSpec(RoutedSpec, frozen=True, kw_only=True, omit_defaults=True, tag="kafka"):
    """``shardsink.sources.kafka.KafkaSource``. ``client``: extra kafka-python settings that are
    not secrets. SUBTLE: ``bootstrap`` defaults to "" only so that sidecars written without
    it (early versions of the test fixtures) still read; the source refuses an empty one."""

    topic: str
    bootstrap: str = ""
    group_id: str | None = None
    offset_columns: bool = False
    probe: Probe = "fetch"
    chunk: int = 50_000
    read_timeout_s: float = 60.0
    client: dict[str, Any] | None = None
    schema: dict[str, Any] | None = None
    columns: dict[str, str] | None = None


class CustomSpec(SpecBase, frozen=True, kw_only=True, omit_defaults=True, tag="custom"):
    """A kind this module does not know: ``target`` (the registered kind or ``"module:Class"``)
    and the rest of its dict layout."""

    target: str
    options: dict[str, Any] = msgspec.field(default_factory=dict)


S = TypeVar("S", bound=SpecBase)

#: The tagged union (what typed documents hold).
SourceSpec = LandingSpec | FilesSpec | KafkaSpec | CustomSpec
#: The kinds whose dict layout is their tagged encoding.
BUILTIN: dict[str, type[LandingSpec | FilesSpec | KafkaSpec]] = {
    "landing": LandingSpec, "files": FilesSpec, "kafka": KafkaSpec,
}


def spec_from_builtins(obj: Mapping[str, Any] | SourceSpec, *, where: str = "source spec") -> SourceSpec:
    """The typed spec of a dict-layout spec (a typed one is returned as is).

    InvalidUsageError naming ``where`` and the offending field when it does not fit its kind.
    """
    if isinstance(obj, SpecBase):
        return obj  # type: ignore[return-value]
    if not isinstance(obj, Mapping):
        raise InvalidUsageError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise InvalidUsageError(f"{where} {dict(obj)!r} has no 'kind'")
    cls = BUILTIN.get(kind)
    try:
        if cls is not None:
            return msgspec.convert(dict(obj), cls)
        if kind == "custom":  # the tagged encoding of a CustomSpec
            return msgspec.convert(dict(obj), CustomSpec)
    except msgspec.ValidationError as e:
        raise InvalidUsageError(f"{where} of kind {kind!r}: {e}", value=kind) from e
    return CustomSpec(target=kind, options={k: v for k, v in obj.items() if k != "kind"})


def spec_as(obj: Mapping[str, Any] | SourceSpec, cls: type[S], *, where: str = "source spec") -> S:
    """``obj`` read as a ``cls`` spec, whatever its ``kind`` says (a subclass of a source, with
    its own ``"module:Class"`` kind, reads its base's fields from its dict layout).

    InvalidUsageError naming ``where`` and the offending field when it does not fit.
    """
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, CustomSpec):
        obj = obj.options
    if not isinstance(obj, Mapping):
        raise InvalidUsageError(f"{where}: a {spec_kind(obj)!r} spec is not a {cls.__struct_config__.tag!r} spec")
    try:
        return msgspec.convert({**obj, "kind": cls.__struct_config__.tag}, cls)
    except msgspec.ValidationError as e:
        raise InvalidUsageError(f"{where} of kind {obj.get('kind')!r}: {e}", value=obj.get("kind")) from e


def spec_to_builtins(spec: SourceSpec | Mapping[str, Any]) -> dict[str, Any]:
    """The dict layout of ``spec`` (JSON values only; equal to its own JSON round trip)."""
    if isinstance(spec, CustomSpec):
        return {**msgspec.json.decode(msgspec.json.encode(spec.options)), "kind": spec.target}
    if isinstance(spec, Mapping):
        return spec_to_builtins(spec_from_builtins(spec))
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(spec))
    # msgspec's omit_defaults compares some values by identity (a decoded 50000 is not the
    # default's object): leave out every value equal to its default, so the layout is canonical.
    for f in msgspec.structs.fields(spec):
        if f.default is not msgspec.NODEFAULT and f.encode_name in out:
            v = out[f.encode_name]
            if v == f.default and isinstance(v, bool) == isinstance(f.default, bool):
                del out[f.encode_name]
    return out


def spec_kind(spec: SourceSpec) -> str:
    """The ``kind`` of the dict layout (a custom spec's target)."""
    return spec.target if isinstance(spec, CustomSpec) else type(spec).__struct_config__.tag  # type: ignore[return-value]
