"""shardsink: exactly-once batch persistence into shards on S3 or a local folder.

Public handles::

    from shardsink import Shard
    shard = Shard.create("file:///data/events", schema)
    shard.append(table, lower=0, upper=1000)
    shard.snapshot(as_of=999)

    shard.writer()   # WriteHandle: batch builder, stage, compare_and_append, fate, delete_staged
    shard.reader()   # ReadHandle: head, versions, batches, parts, snapshot, changes, leases, log

The names above are imported on first use (PEP 562 ``__getattr__``), not with the package:
Airflow imports ``shardsink.provider`` in every one of its processes (the provider entry point,
read when ``airflow.configuration`` loads), and the handles pull in pyarrow and the whole core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardsink.core.read import ReadHandle
    from shardsink.core.shard import AppendResult, Shard, ShardInfo, StagedBatch
    from shardsink.core.write import WriteHandle
    from shardsink.errors import (
        ConditionFailedError,
        CorruptionError,
        DescriptionConflictError,
        FateUnknownError,
        InvalidUsageError,
        LeaseLostError,
        ReadFrontierError,
        ShardClosedError,
        ShardExistsError,
        ShardNotFoundError,
        ShardsinkError,
        StorageError,
        UnknownOutcomeError,
        UpperMismatchError,
    )

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "ConditionFailedError",
    "CorruptionError",
    "DescriptionConflictError",
    "FateUnknownError",
    "InvalidUsageError",
    "LeaseLostError",
    "ReadFrontierError",
    "ReadHandle",
    "Shard",
    "ShardClosedError",
    "ShardExistsError",
    "ShardInfo",
    "ShardNotFoundError",
    "ShardsinkError",
    "StagedBatch",
    "StorageError",
    "UnknownOutcomeError",
    "UpperMismatchError",
    "WriteHandle",
]

#: Where each public name lives (imported by :func:`__getattr__` on first use).
_HOMES = {"ReadHandle": "shardsink.core.read", "WriteHandle": "shardsink.core.write",
          **dict.fromkeys(("AppendResult", "Shard", "ShardInfo", "StagedBatch"), "shardsink.core.shard")}


def __getattr__(name: str) -> Any:
    import importlib

    if name in __all__:
        value = getattr(importlib.import_module(_HOMES.get(name, "shardsink.errors")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardsink' has no attribute {name!r}")
