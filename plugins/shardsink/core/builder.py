"""The one batch builder: every part of a shard is written through it.

A :class:`BatchBuilder` writes the parts of one description (an append's ``desc_id`` or a
compaction's ``cid``) under the prefix that description owns (:func:`shardsink.core.keys.parts_prefix`),
through the store it was given (from the store factory: a retrying blob), and returns typed
:class:`~shardsink.core.state.PartMeta` records. Three writers use it:

* :meth:`shardsink.core.shard.Shard.stage` and the Spark executors
  (:mod:`shardsink.spark.stage`): :meth:`BatchBuilder.stage` validates nothing (the caller
  did), consolidates and writes sorted parts, or with ``PartOptions(order="unordered")``
  writes the rows as they came, as unordered parts (no sort, no consolidation: the fast
  ingest path; compaction sorts them later);
* compaction's streaming merge: :meth:`BatchBuilder.put_part` uploads one encoded part it
  cut from the merged, consolidated stream;
* corrections written already consolidated: :meth:`BatchBuilder.write_consolidated`.

A process that holds no handle (a Spark executor) gets a :class:`PartWriterSpec` from
:meth:`shardsink.core.write.WriteHandle.part_writer`: a picklable value it turns into a
builder (:meth:`PartWriterSpec.open`) without opening the store or spelling a key itself.

SUBTLE: every part gets a fresh unique key (:func:`shardsink.core.keys.part_key`), so a
retried upload, a retried Spark task or a twin writer never overwrites an object another
attempt may have listed in its manifest. Part uploads are therefore safe to retry blindly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from shardsink.core import checks as ck
from shardsink.core import keys
from shardsink.core import part_io as pio
from shardsink.core.state import PART_ORDERS, PartMeta, PartOrder
from shardsink.errors import InvalidUsageError
from shardsink.storage.base import Blob
from shardsink.storage.url import open_blob


@dataclass(frozen=True, kw_only=True)
class PartOptions:
    """How parts are cut and encoded (as delta-rs's ``WriterProperties``).

    ``target_bytes``: in-memory size of one part before encoding; ``encoding``: ``"default"``
    or ``"compact"`` (zstd, dictionaries only for low-cardinality columns; for small sparse
    corrections); ``threads``: at most that many slices staged in parallel (1 where the
    caller owns one core, as a Spark task does; None: up to the machine's cores);
    ``order`` (:data:`shardsink.core.state.PartOrder`): what :meth:`BatchBuilder.stage` writes,
    ``"sorted"`` (consolidated and sorted parts) or ``"unordered"`` (the rows as given).
    """

    target_bytes: int = pio.TARGET_PART_BYTES
    encoding: pio.PartEncoding = "default"
    threads: int | None = None
    order: PartOrder = "sorted"
    #: ``(column name, field id)`` written into each part's Parquet schema (the shard schema's
    #: field ids, :func:`shardsink.core.schema.parquet_field_ids`); () writes none.
    field_ids: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.target_bytes, bool) or not isinstance(self.target_bytes, int) or not (
                1 <= self.target_bytes <= 1 << 40):
            raise ValueError(f"target_bytes must be an int in [1, 2^40], got {self.target_bytes!r}")
        if self.encoding not in ("default", "compact"):
            raise ValueError(f"encoding must be 'default' or 'compact', got {self.encoding!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or not 1 <= self.threads <= 256):
            raise ValueError(f"threads must be None or an int in [1, 256], got {self.threads!r}")
        if self.order not in PART_ORDERS:
            raise ValueError(f"order must be 'sorted' or 'unordered', got {self.order!r}")


#: The default part options (a module-level value, so signatures can default to it).
DEFAULT_PART_OPTIONS = PartOptions()


class BatchBuilder:
    """Writes the parts of description ``desc_id`` into ``blob``; :attr:`parts` lists them.

    ``label`` puts the parts in a sub-folder of the description's prefix (re-processing marks
    correction parts so). Thread-safe: executors and merge threads may add parts concurrently.
    """

    def __init__(self, blob: Blob, desc_id: str, *, label: str | None = None,
                 options: PartOptions = PartOptions()) -> None:
        self._blob = blob
        self.desc_id = desc_id
        self.prefix = keys.parts_prefix(desc_id, label=label)
        self.options = options
        self._lock = threading.Lock()
        self._parts: list[PartMeta] = []

    @property
    def parts(self) -> tuple[PartMeta, ...]:
        """Every part written so far, in the order they were written."""
        with self._lock:
            return tuple(self._parts)

    def _record(self, written: Sequence[PartMeta]) -> tuple[PartMeta, ...]:
        with self._lock:
            self._parts.extend(written)
        return tuple(written)

    def stage(self, updates: pa.Table, sort_keys: Sequence[str]) -> tuple[PartMeta, ...]:
        """Consolidate validated ``updates`` (sorted by ``sort_keys``: the user columns, then
        ``_time``) and write them as parts; returns the parts this call wrote. With
        ``options.order == "unordered"``: write them as they are, as unordered parts."""
        o = self.options
        if o.order == "unordered":
            return self._record(pio.stage_unordered(self._blob, updates, prefix=self.prefix,
                                                    target_bytes=o.target_bytes, encoding=o.encoding,
                                                    threads=o.threads, field_ids=o.field_ids))
        return self._record(pio.stage_parts(self._blob, updates, sort_keys, prefix=self.prefix,
                                            target_bytes=o.target_bytes, encoding=o.encoding, threads=o.threads,
                                            field_ids=o.field_ids))

    def write_consolidated(self, table: pa.Table) -> tuple[PartMeta, ...]:
        """Write ``table``, already consolidated and sorted, as parts; returns them."""
        o = self.options
        return self._record(pio.write_parts(self._blob, table, prefix=self.prefix, target_bytes=o.target_bytes,
                                            encoding=o.encoding, field_ids=o.field_ids))

    def put_part(self, data: bytes, *, rows: int, min_time: int, max_time: int) -> PartMeta:
        """Upload one encoded Parquet part (consolidated and sorted) under a fresh key."""
        key = keys.part_key(self.prefix)
        self._blob.put(key, data)
        return self._record([PartMeta(key, rows, len(data), min_time, max_time)])[0]


def check_label(label: object) -> str | None:
    """A parts sub-folder label (one key segment, the charset of a description id) or None."""
    if label is None:
        return None
    if not isinstance(label, str):
        raise InvalidUsageError(f"label {label!r:.80} is not a string", value=str(label)[:80])
    try:
        return ck.check_desc_id(label)
    except InvalidUsageError:
        raise InvalidUsageError(f"label {label[:200]!r} is invalid; expected 1-{ck.DESC_ID_MAX} letters, digits "
                                "or -_.=+ (one key segment)", value=label[:200]) from None


class _Dropped:
    """A dry run's store: ``put`` accepts a part and drops it (nothing reaches the store)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def put(self, key: str, data: bytes) -> str:
        del key, data
        return ""


@dataclass(frozen=True, kw_only=True)
class PartWriterSpec:
    """How to write parts of description ``desc_id`` into the shard at ``url``: a picklable value
    (from :meth:`shardsink.core.write.WriteHandle.part_writer`, which checks it) that a process
    holding no handle turns into a :class:`BatchBuilder` (:meth:`open`).

    ``dry_run``: the builder encodes parts exactly as it would write them, but uploads nothing
    (the returned metadata is real, its keys name no object).

    SUBTLE: a spec carries no credentials: the opening process reaches the store with its own
    environment (as every executor does).
    """

    url: str
    desc_id: str
    label: str | None = None
    options: PartOptions = DEFAULT_PART_OPTIONS
    dry_run: bool = False

    def __post_init__(self) -> None:
        ck.check_desc_id(self.desc_id)
        check_label(self.label)
        if not isinstance(self.url, str) or not self.url:
            raise InvalidUsageError(f"url must be a shard URL, got {self.url!r:.80}", value=str(self.url)[:80])
        if not isinstance(self.options, PartOptions):
            raise InvalidUsageError(f"options must be a PartOptions, got {type(self.options).__name__}")
        if not isinstance(self.dry_run, bool):
            raise InvalidUsageError(f"dry_run must be a bool, got {self.dry_run!r:.60}", value=str(self.dry_run)[:60])

    @property
    def prefix(self) -> str:
        """Where the parts go (no trailing slash; the description owns it exclusively)."""
        return keys.parts_prefix(self.desc_id, label=self.label)

    def fresh_key(self) -> str:
        """A fresh, unique part key under :attr:`prefix` (for a writer that names its own files)."""
        return keys.part_key(self.prefix)

    def open(self) -> BatchBuilder:
        """A builder writing through this process's store of :attr:`url` (retried part uploads:
        every part gets a fresh key, so a blind retry never overwrites)."""
        blob: Blob = _Dropped(self.url) if self.dry_run else open_blob(self.url)  # type: ignore[assignment]
        return BatchBuilder(blob, self.desc_id, label=self.label, options=self.options)
