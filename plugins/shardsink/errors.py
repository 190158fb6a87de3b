"""Error classes, one per thing the caller should do about a failure.

Every error the library raises derives from :class:`ShardsinkError`. The class says
what to do; the message says what happened and names the offending value.

==================================  ==============================================
class                               what the caller does
==================================  ==============================================
:class:`InvalidUsageError`          fix the call or the input; nothing was written
:class:`InvalidConfigurationError`  fix the named setting (connection, variable); not retried
:class:`UpperMismatchError`         mint a fresh description from ``current`` upper
:class:`UnknownOutcomeError`        re-read state before deciding anything
:class:`FateUnknownError`           check the data by hand; never re-send blindly (exit 5)
:class:`StorageError`               retry later (the request definitely failed)
:class:`UnsafeStoreError`           use a store that honours conditional writes
:class:`CorruptionError`            stop and page a human; never guess
:class:`LeaseLostError`             re-run the read: its frontier may have moved under it
==================================  ==============================================
"""

from __future__ import annotations


class ShardsinkError(Exception):
    """Base class of every shardsink error. ``exit_code`` is what the CLI returns.

    ``value`` optionally carries the offending value on its own (the message names it
    too), so a machine-readable error record (:mod:`shardsink.outcome`) can report it.
    """

    exit_code: int = 1
    value: str | None = None

    def __init__(self, *args: object, value: object = None) -> None:
        super().__init__(*args)
        if value is not None:
            self.value = str(value)


class InvalidUsageError(ShardsinkError):
    """Bad bounds, bad input, schema mismatch, bad URL: nothing was written."""

    exit_code = 2


class InvalidConfigurationError(InvalidUsageError):
    """A deployment setting is missing or wrong (an Airflow connection, an environment variable);
    the message names it. Found before anything is written; retrying cannot help."""


class ShardNotFoundError(InvalidUsageError):
    """The URL names no shard (no state version exists under it)."""


class ShardExistsError(InvalidUsageError):
    """``create`` found a shard already there; it was left untouched."""


class ShardClosedError(InvalidUsageError):
    """The shard's upper is the empty frontier: it accepts no more writes."""


class ReadFrontierError(InvalidUsageError):
    """A read asked for times the shard cannot serve (``as_of < since`` or ``>= upper``)."""


class UpperMismatchError(ShardsinkError):
    """The shard's upper is not the description's lower: someone else was faster.

    Expected under concurrency. Nothing from this attempt was committed; mint a fresh
    description starting at :attr:`current`.
    """

    exit_code = 3

    def __init__(self, message: str, *, expected: int, current: int | None) -> None:
        super().__init__(message)
        self.expected = expected
        self.current = current


class UnknownOutcomeError(ShardsinkError):
    """A write may or may not have been applied (timeout, 409, 5xx after sending).

    SUBTLE: never clean up after this error; re-read state and decide from what is there.
    """


class FateUnknownError(ShardsinkError):
    """Whether a description committed is not known: the evidence is older than the retained
    history (GC removed the version that sealed its lower, and no retained batch or
    compaction lineage names it). It can no longer commit.

    Do NOT mint a fresh description for its rows: they may already be in the shard. Check
    the shard's contents (``snapshot`` / ``changes`` over its bounds) before re-sending them.
    CLI exit code 5.
    """

    exit_code = 5


class DescriptionConflictError(InvalidUsageError):
    """A description id was reused with other bounds than the batch it committed: an id names
    one description. Nothing was written for this request; use a fresh id."""


class StorageError(ShardsinkError):
    """The store refused or failed a request that was definitely not applied.

    ``retryable`` says whether backing off and trying again can help (5xx, throttling,
    connection refused) or not (access denied, no such bucket).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class UnsafeStoreError(StorageError):
    """The store ignores (or refuses) ``If-None-Match`` or ``If-Match``: it failed the
    conditional-write probe (:mod:`shardsink.storage.probe`), so shardsink refuses to write to
    it; nothing was written under any shard, and reads still work. Retrying cannot help: use a
    store that honours conditional writes (docs/runbooks/unsafe-store.md). Never retryable.
    """

    def __init__(self, message: str, *, value: object = None) -> None:
        super().__init__(message, retryable=False)
        if value is not None:
            self.value = str(value)


class ConditionFailedError(ShardsinkError):
    """A conditional write lost: the object exists (create) or changed (replace).

    Internal signal of the storage layer (HTTP 412); the commit loop turns it into a
    re-read. It definitely did not apply.
    """


class LeaseLostError(ShardsinkError):
    """A reader's lease expired or vanished while it was held (see ``core/leases.py``).

    Compaction may have advanced ``since`` past the read and GC may have removed what
    it read: the job's result may be incomplete. Re-run it.
    """


class CorruptionError(ShardsinkError):
    """State or data is unreadable or inconsistent (bad JSON, missing part, negative count)."""
