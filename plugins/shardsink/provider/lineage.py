"""OpenLineage datasets of shardsink tasks: inputs (landing prefix, topic, input shards) → the shard.

Dataset naming follows the OpenLineage conventions: a shard or landing zone on S3 is
namespace ``s3://<bucket>``, name ``<prefix>``; on a local folder namespace ``file``,
name ``/abs/path``; a Kafka topic is namespace ``kafka://<first bootstrap host:port>``,
name ``<topic>``. Outputs carry a schema facet (the shard's columns) and, once the
task knows it, an output-statistics facet (rows and bytes committed).

Used by :class:`shardsink.provider.operators.ShardTaskMixin`'s
``get_openlineage_facets_on_start`` / ``_on_complete`` (the operator methods the
OpenLineage provider calls). Nothing here is imported unless the OpenLineage provider
asks for lineage, and a failure never fails a task (the provider logs it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from shardsink.errors import InvalidUsageError
from shardsink.storage.url import parse_url


@dataclass(frozen=True)
class DatasetName:
    namespace: str
    name: str


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


def operator_lineage(*, shard_url: str, inputs: Sequence[DatasetName], schema: Any = None,
                     rows: int | None = None, size: int | None = None) -> Any:
    """An ``OperatorLineage`` for the OpenLineage provider: ``inputs`` → the shard at ``shard_url``."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset, OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats
    from openlineage.client.facet_v2 import schema_dataset

    out = shard_dataset(shard_url)
    facets: dict[str, Any] = {}
    if schema is not None:
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=[schema_dataset.SchemaDatasetFacetFields(name=f.name, type=str(f.type)) for f in schema])
    out_facets: dict[str, Any] = {}
    if rows is not None:
        out_facets["outputStatistics"] = stats.OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size)
    return OperatorLineage(
        inputs=[Dataset(namespace=d.namespace, name=d.name) for d in inputs],
        outputs=[OutputDataset(namespace=out.namespace, name=out.name, facets=facets, outputFacets=out_facets)],
    )
