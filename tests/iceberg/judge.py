"""What Iceberg readers see of a shard's view, against what shardsink reads at the same version.

The judges are pyiceberg (``StaticTable.from_metadata``), Polars (``scan_iceberg``) and fastavro
(the manifests); nothing here parses Iceberg metadata of its own accord.
"""

from __future__ import annotations

import io
import os
from collections import Counter
from typing import Any

import fastavro
import polars as pl
import pyarrow as pa
from pyiceberg.table import StaticTable

from shardsink.core import schema as sc
from shardsink.core.shard import Shard
from shardsink.core.state import Version

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # no polars_iceberg plugin here
Rows = Counter[tuple[Any, ...]]


def io_props(url: str) -> dict[str, str]:
    """pyiceberg / Polars storage settings for the shard's store (moto's endpoint for S3)."""
    if not url.startswith("s3://"):
        return {}
    return {"s3.endpoint": os.environ["AWS_ENDPOINT_URL"], "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing", "s3.region": "us-east-1"}


def polars_options(url: str) -> dict[str, str] | None:
    if not url.startswith("s3://"):
        return None
    return {"aws_endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing", "aws_region": "us-east-1", "aws_allow_http": "true"}


def consolidated(table: pa.Table) -> Rows:
    """Rows (user columns, ``_time``) with their summed ``_diff`` (null: 1), zero sums dropped."""
    cols = [c for c in table.column_names if c != "_diff"]
    diffs = table.column("_diff").to_pylist() if "_diff" in table.column_names else [1] * table.num_rows
    out: Rows = Counter()
    for row, d in zip(zip(*(table.column(c).to_pylist() for c in cols), strict=True), diffs, strict=True):
        out[row] += 1 if d is None else d
    return Counter({k: v for k, v in out.items() if v != 0})


def shard_at(shard: Shard, v: Version) -> tuple[list[str], Rows]:
    """Column names and consolidated updates of every live part at version ``v`` (its current schema)."""
    reader = shard.reader()
    target = sc.current(v.header)
    tables = [sc.project(reader.read_parts(b.parts, sc.entry_schema(source)), source, target)
              for b in reader.batches(v) if b.parts
              for source in [sc.entry(v.header, b.schema_id) or target]]
    names = [*sc.entry_schema(target).names, "_time", "_diff"]
    table = pa.concat_tables(tables, promote_options="permissive") if tables else None
    return names, consolidated(table) if table is not None else Counter()


def iceberg_at(location: str, snapshot_id: int, url: str) -> tuple[list[str], Rows, Rows]:
    """Column names and consolidated rows of the snapshot through pyiceberg, and through Polars."""
    table = StaticTable.from_metadata(location, properties=io_props(url))
    got = table.scan(snapshot_id=snapshot_id).to_arrow()
    # Polars plans through pyiceberg from the path on a local folder; on S3 it is handed the table
    # (its path form opens no endpoint setting) and reads the files itself with storage_options.
    source: Any = table if url.startswith("s3://") else location
    frame = pl.scan_iceberg(source, snapshot_id=snapshot_id, storage_options=polars_options(url)).collect()
    return got.column_names, consolidated(got), consolidated(frame.to_arrow())


def manifest_files(location: str, snapshot_id: int, url: str) -> set[str]:
    """The data files a snapshot's manifests list as live, read with fastavro."""
    table = StaticTable.from_metadata(location, properties=io_props(url))
    snap = table.metadata.snapshot_by_id(snapshot_id)
    assert snap is not None
    fio = table.io
    out = set()
    for m in fastavro.reader(io.BytesIO(fio.new_input(snap.manifest_list).open().read())):
        for e in fastavro.reader(io.BytesIO(fio.new_input(m["manifest_path"]).open().read())):  # type: ignore[index,call-overload]
            if e["status"] != 2:  # type: ignore[index,call-overload]
                out.add(e["data_file"]["file_path"])  # type: ignore[index,call-overload]
    return out
