"""The engine readers' leased plans: :func:`open_plan` takes a read lease and the one plan
(:mod:`shardsink.core.plan`) DuckDB and Polars translate into their scan + filter + ``GROUP BY``.

The plan decides which parts of which state version are scanned, each part's projection onto
the reader's schema (schema evolution: a per-part projection by field id, exactly as the pyarrow
reads) and the time filter; engines scan each group of parts sharing a projection
(:meth:`~shardsink.core.plan.ReadPlan.groups`) and union them. The semantics are those of
:meth:`shardsink.core.read.ReadHandle.snapshot` / :meth:`~shardsink.core.read.ReadHandle.changes`
(:mod:`shardsink.core.plan`'s docstring).

**Leases.** The :class:`Lease` renews the read's lease (:func:`shardsink.core.plan.pin`) from a
daemon thread until :meth:`Lease.close`.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from shardsink.core import plan as pl
from shardsink.core.leases import DEFAULT_TTL_S, LeaseKeeper
from shardsink.core.plan import ReadPlan, SchemaChoice
from shardsink.core.shard import Shard, default_writer
from shardsink.errors import InvalidUsageError, LeaseLostError

log = logging.getLogger(__name__)


class Lease:
    """A read lease held for an engine's relation or frame; renewed until :meth:`close`.

    ``close`` is idempotent; it raises LeaseLostError if the lease was lost on the way (the
    read may not have been protected). :meth:`tie` releases it when an object is
    garbage-collected (then a loss is only logged: there is no caller to raise to).
    """

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper
        self._finalizer: weakref.finalize[[LeaseKeeper], Any] | None = None

    def tie(self, obj: object) -> None:
        """Release the lease when ``obj`` is garbage-collected (if not closed before)."""
        self._finalizer = weakref.finalize(obj, _close_quietly, self._keeper)

    @property
    def held(self) -> bool:
        return bool(self._keeper.leases())

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self._keeper.close()


def _close_quietly(keeper: LeaseKeeper) -> None:
    try:
        keeper.close()
    except LeaseLostError as e:
        log.warning("a shardsink read lease was lost before its reader was collected: %s", e)
    except Exception as e:  # a finaliser must not raise
        log.warning("releasing a shardsink read lease failed (it will expire): %s", e)


def open_plan(url: str, as_of: int | None = None, *, changes: tuple[int, int] | None = None,
              holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
              schema: SchemaChoice = "current") -> tuple[ReadPlan, Lease]:
    """Take a lease and plan the snapshot at ``as_of`` (default ``upper - 1``) or, with
    ``changes=(lower, upper)``, the feed, from the version pinned after the lease
    (:func:`shardsink.core.plan.pin`).

    Refuses (InvalidUsageError / ReadFrontierError, no lease left behind) a bad ``schema``
    choice, bad bounds, an ``as_of`` outside ``[since, upper)`` and a change range outside
    ``[since, upper]``.
    """
    schema = pl.check_schema_choice(schema)
    if holder is not None and (not isinstance(holder, str) or not holder):
        raise InvalidUsageError(f"lease holder {holder!r:.120} must be a non-empty string")
    shard = Shard(url)
    keeper = LeaseKeeper(ttl_s=ttl_s)
    try:
        pinned = pl.pin(shard, keeper, shard.reader().head(), holder=holder or f"engine-read@{default_writer()}",
                        as_of=as_of, changes=changes, schema=schema)
        plan = pl.plan_pinned(shard, pinned)
    except BaseException:
        keeper.close()
        raise
    return plan, Lease(keeper)
