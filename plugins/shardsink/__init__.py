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
