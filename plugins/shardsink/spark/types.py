"""Arrow ↔ Spark schema mapping for shard schemas (pyspark imported lazily).

A shard's schema is Arrow; Spark sees each user column through pyspark's own mapping
(``int64`` → ``bigint``, ``string``/``large_string`` → ``string``, ``timestamp[*, tz]`` →
``timestamp``, ``timestamp[*]`` without zone → ``timestamp_ntz`` …). The mapping is
many-to-one: a Spark ``timestamp`` (microseconds) staged into a ``timestamp[ms]``
column is cast back and refused if it carries sub-millisecond precision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from shardsink.core.updates import TIME
from shardsink.errors import InvalidUsageError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


def spark_type(field: pa.Field) -> DataType:
    """The Spark type of one shard column; InvalidUsageError if Spark has none (e.g. uint64)."""
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        return from_arrow_type(field.type)
    except Exception as e:
        raise InvalidUsageError(
            f"column {field.name!r} has type {field.type}, which Spark cannot represent: {e}"
        ) from e


def spark_schema(user: pa.Schema, *, time: bool, diff: str | None) -> StructType:
    """Spark schema of ``user`` columns, plus ``_time`` if ``time`` and a non-null ``diff`` column."""
    from pyspark.sql.types import LongType, StructField, StructType

    fields = [StructField(f.name, spark_type(f), nullable=f.nullable) for f in user]
    if time:
        fields.append(StructField(TIME, LongType(), nullable=False))
    if diff is not None:
        fields.append(StructField(diff, LongType(), nullable=False))
    return StructType(fields)


def arrow_wire_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects of batches yielded by a Python data source."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def describe(schema: StructType) -> str:
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
