"""The object an engine reader returns: the engine's relation or frame plus its read lease.

::

    with shardsink.read.duckdb(con, url) as rel:     # a duckdb.DuckDBPyRelation
        rel.aggregate("count(*)").fetchall()        # runs under the lease
    # lease released here

    snap = shardsink.read.polars(url)               # a LeasedRead; snap.value is the LazyFrame
    snap.collect()                                  # attribute access goes to the frame
    snap.close()                                    # or let it be garbage-collected

**Lease contract.** The lease is held from the call until the first of: the end of the
``with`` block, :meth:`LeasedRead.close`, or the garbage collection of the returned
relation or frame (``.value``: the lease is held while this object or anyone else still
references it). HAZARD: a relation or frame *derived* from it (``rel.filter(...)``,
``lf.join(...)``) does not keep the lease: its parts may be deleted by GC once the original
is gone. Run derived queries inside the ``with`` block (or keep the returned object) —
as for :func:`shardsink.spark.read.read_snapshot`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Generic, TypeVar

from shardsink.core.plan import ReadPlan
from shardsink.read.plan import Lease

T = TypeVar("T")


class LeasedRead(Generic[T]):
    """An engine's lazy result of ``plan`` (``value``), holding ``lease`` (module docstring).

    A context manager yielding the engine object itself; other attributes are forwarded to
    it, so ``leased.fetchall()`` / ``leased.collect()`` work without the block.
    """

    def __init__(self, value: T, plan: ReadPlan, lease: Lease) -> None:
        self.value = value
        self.plan = plan
        self.lease = lease
        lease.tie(value)

    def __enter__(self) -> T:
        return self.value

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the lease (idempotent); LeaseLostError if it was lost while held."""
        self.lease.close()

    def __getattr__(self, name: str) -> Any:
        if name in ("value", "plan", "lease"):  # not yet set (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.value, name)

    def __repr__(self) -> str:
        return f"LeasedRead({self.plan.describe()}, {len(self.plan.parts)} parts, leased={self.lease.held})"
