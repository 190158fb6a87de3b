"""Sample rows of a DataFrame for reports (dry runs, re-processing summaries).

Contract: :func:`sample_rows` collects at most ``n`` rows to the driver and returns them as
JSON-able dicts; values that are not plain JSON scalars (dates, decimals, binary, ...)
become their ``str``. It sits below both :mod:`shardsink.spark.dryrun` and
:mod:`shardsink.spark.reprocess`, which share it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def sample_rows(df: DataFrame, n: int) -> list[dict[str, Any]]:
    """Up to ``n`` rows of ``df`` as JSON-able dicts (values that are not JSON become strings)."""
    return [{k: _plain(v) for k, v in r.asDict().items()} for r in df.limit(n).collect()]
