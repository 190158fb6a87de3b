"""shardsink: exactly-once batch persistence into shards on S3 or a local folder.

Public handles::

    from shardsink import Shard
    shard = Shard.create("file:///data/events", schema)
    shard.append(table, lower=0, upper=1000)
    shard.snapshot(as_of=999)

    shard.writer()   # WriteHandle: batch builder, stage, compare_and_append, fate, delete_staged
    shard.reader()   # ReadHandle: head, versions, batches, parts, snapshot, changes, leases, log
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from shardsink.core.read import ReadHandle
    from shardsink.core.shard import AppendResult, Shard, ShardInfo, StagedBatch
    from shardsink.core.write import WriteHandle

#: The handles, imported when first asked for (``from shardsink import Shard``): a process that
#: imports only a light module of the package (the Spark worker daemon's launcher,
#: shardsink/spark/forkserver.py) does not pay for core and pyarrow.
_LAZY = {"ReadHandle": "shardsink.core.read", "AppendResult": "shardsink.core.shard",
         "Shard": "shardsink.core.shard", "ShardInfo": "shardsink.core.shard", "StagedBatch": "shardsink.core.shard",
         "WriteHandle": "shardsink.core.write"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardsink' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

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
