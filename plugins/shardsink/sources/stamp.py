"""Stamping a reclocked source's records: conform them to the shard and set their binding time.

Contract: :func:`stamp` returns the shard's user columns (validated like
any update) plus ``_time`` = the time of the binding that covers the records; a record
set whose columns differ from the shard's, or whose values do not fit them, is refused
with a :class:`~shardsink.sources.landing.MalformedInputError` naming ``where`` (the file
or Kafka range). Shared by every reclocked source (:mod:`shardsink.sources.files`,
:mod:`shardsink.sources.kafka`).
"""

from __future__ import annotations

import pyarrow as pa

from shardsink.core.updates import DIFF, TIME, validate_updates
from shardsink.errors import InvalidUsageError
from shardsink.sources.evolution import STRICT_HINT, SchemaMode, conform
from shardsink.sources.landing import MalformedInputError


def stamp(table: pa.Table, schema: pa.Schema, time_ms: int, *, where: str,
          schema_mode: SchemaMode = "strict") -> pa.Table:
    """``table`` conformed to the shard's user columns plus ``_time = time_ms``; errors name ``where``.
    ``schema_mode="add_columns"``: read onto ``schema`` (:func:`shardsink.sources.evolution.conform`:
    missing nullable columns as nulls; every row is in the batch, so an unknown column is refused)."""
    if schema_mode == "add_columns":
        table = conform(table, schema, where=where)
    missing = [n for n in schema.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in schema.names]
    if missing or extra:
        raise MalformedInputError(f"{where}: columns do not match the shard: missing {missing}, unexpected {extra}"
                                  f"{STRICT_HINT if extra else ''}", value=(extra or missing)[0])
    t = table.append_column(TIME, pa.repeat(pa.scalar(time_ms, pa.int64()), table.num_rows))
    try:
        t = validate_updates(t, schema, lower=-(2**63), upper=None)
    except InvalidUsageError as e:
        raise MalformedInputError(f"{where}: {e}") from e
    return t.drop_columns([DIFF])
