"""OpenLineage datasets of shardsink tasks: inputs (landing prefix, topic, input shards) → the shard.

Dataset naming follows the OpenLineage conventions: a shard or landing zone on S3 is
namespace ``s3://<bucket>``, name ``<prefix>``; on a local folder namespace ``file``,
name ``/abs/path``; a Kafka topic is namespace ``kafka://<first bootstrap host:port>``,
name ``<topic>``. The output (and maintenance's input) has an output-statistics facet
once the task knows it (rows and bytes committed).

Schema facets: every SHARD dataset a task reports (its output; a view's input shards;
maintenance's shard as input) carries the shard's CURRENT schema, read from its head when
the event is built (:func:`shard_columns`): after any schema change committed before it
(``shardsink schema --add/--drop/--rename/...``), so a column added between two runs is in
the next run's lineage, and on a task's COMPLETE event the schema its run ends with. The
facet lists the user columns in order, each with its type (``str(pyarrow type)``) and a
description naming its stable field id (``field id 3``; ``, not null`` if required), which
lets a consumer follow a rename. shardsink's own ``_time`` and ``_diff`` columns are NOT
listed: every shard has them, no snapshot read returns them, and they are not part of the
schema history. A shard that does not exist yet (a first mint) reports the ingest
source's columns (no field ids); a landing zone or topic input carries no schema facet.

Used by :class:`shardsink.provider.operators.ShardTaskMixin`'s
``get_openlineage_facets_on_start`` / ``_on_complete`` (the operator methods the
OpenLineage provider calls). Nothing here is imported unless the OpenLineage provider
asks for lineage, and a failure never fails a task (the provider logs it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from shardsink.errors import InvalidUsageError
from shardsink.storage.url import parse_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetName:
    namespace: str
    name: str


@dataclass(frozen=True)
class Column:
    """One field of a schema facet."""

    name: str
    type: str
    description: str | None = None


@dataclass(frozen=True)
class ReportedDataset:
    """A dataset a task reports, with its schema facet's columns (None: no schema facet)."""

    name: DatasetName
    columns: tuple[Column, ...] | None = None


def shard_columns(url: str) -> tuple[Column, ...] | None:
    """The user columns of the shard's current schema (one head read), each with its type and
    field id; None if no shard exists at ``url`` yet. Other read errors propagate (the
    OpenLineage provider logs them; lineage never fails a task)."""
    from shardsink.core.shard import Shard
    from shardsink.errors import ShardNotFoundError

    try:
        current = Shard.open(url).schema_history()[-1]
    except ShardNotFoundError:
        return None
    return tuple(Column(f.name, f.type, f"field id {f.id}" + ("" if f.nullable else ", not null"))
                 for f in current.fields)


def arrow_columns(schema: Any) -> tuple[Column, ...]:
    """The columns of a pyarrow schema (a source's: no field ids yet)."""
    return tuple(Column(f.name, str(f.type), None if f.nullable else "not null") for f in schema)


def shard_dataset(url: str) -> DatasetName:
    """The OpenLineage dataset of a shard URL (file:///abs or s3://bucket/prefix)."""
    u = parse_url(url)
    return DatasetName("file", u.path) if u.scheme == "file" else DatasetName(f"s3://{u.bucket}", u.path)


def location_dataset(location: str) -> DatasetName:
    """A landing zone or other location: path, file:// or s3:// URL."""
    try:
        return shard_dataset(location)
    except InvalidUsageError:
        p = urlparse(location)
        return DatasetName(f"{p.scheme}://{p.netloc}" if p.netloc else (p.scheme or "file"), p.path.lstrip("/"))


def source_datasets(spec: Mapping[str, Any]) -> list[DatasetName]:
    """The inputs a source or view spec reads (see shardsink.sources and shardsink.sinks.materialize)."""
    if isinstance(spec.get("inputs"), Mapping):  # a view: its input shards
        return [shard_dataset(i["url"]) for i in spec["inputs"].values() if isinstance(i, Mapping) and "url" in i]
    if spec.get("topic"):  # a Kafka-like source
        servers = spec.get("bootstrap_servers") or spec.get("bootstrap") or ""
        first = (servers if isinstance(servers, str) else ",".join(servers)).split(",")[0].strip()
        return [DatasetName(f"kafka://{first}" if first else "kafka", str(spec["topic"]))]
    for key in ("root", "url", "path", "prefix"):
        if isinstance(spec.get(key), str) and spec[key]:
            return [location_dataset(spec[key])]
    return []


def input_datasets(spec: Mapping[str, Any]) -> list[ReportedDataset]:
    """The inputs of a source or view spec (:func:`source_datasets`); a view's input shards with
    their current schema (one head read each), other inputs without a schema facet. An input
    shard whose schema cannot be read is still reported, without a schema facet (logged)."""
    inputs = spec.get("inputs")
    if isinstance(inputs, Mapping):
        urls = [str(i["url"]) for i in inputs.values() if isinstance(i, Mapping) and "url" in i]
        return [ReportedDataset(shard_dataset(u), _input_columns(u)) for u in urls]
    return [ReportedDataset(d) for d in source_datasets(spec)]


def _input_columns(url: str) -> tuple[Column, ...] | None:
    try:
        return shard_columns(url)
    except Exception:  # the names matter more than an input's schema: never lose the event for it
        log.warning("could not read the schema of input shard %s for lineage", url, exc_info=True)
        return None


def _schema_facets(columns: tuple[Column, ...] | None) -> dict[str, Any]:
    from openlineage.client.facet_v2 import schema_dataset

    if columns is None:
        return {}
    return {"schema": schema_dataset.SchemaDatasetFacet(fields=[
        schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.type, description=c.description)
        for c in columns])}


def operator_lineage(*, output: ReportedDataset, inputs: Sequence[ReportedDataset], rows: int | None = None,
                     size: int | None = None) -> Any:
    """An ``OperatorLineage`` for the OpenLineage provider: ``inputs`` → ``output`` (the shard), each
    with its schema facet; the output with an output-statistics facet when ``rows`` is known."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset, OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats

    out_facets: dict[str, Any] = {}
    if rows is not None:
        out_facets["outputStatistics"] = stats.OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size)
    return OperatorLineage(
        inputs=[Dataset(namespace=d.name.namespace, name=d.name.name, facets=_schema_facets(d.columns))
                for d in inputs],
        outputs=[OutputDataset(namespace=output.name.namespace, name=output.name.name,
                               facets=_schema_facets(output.columns), outputFacets=out_facets)],
    )
