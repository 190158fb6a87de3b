"""A source object as a seekable file read through ranged requests (local folder and S3 alike).

:class:`RangedFile` is what pyarrow reads a large landing file through: a Parquet footer
and then one row group at a time (:meth:`RangedFile.prefetch` fetches a row group's byte
range in ONE request, and pyarrow's reads inside it are served from that buffer), or a
CSV / JSONL file front to back in blocks of :data:`BLOCK` bytes. Memory held: the buffer
of the current range, never the whole object.

Every request checks that the object is still the version listed
(:meth:`shardsink.storage.base.Blob.get_source_range`); a change or a deletion mid-read
raises :class:`SourceChangedError`, so one read never mixes two versions of a file.
"""

from __future__ import annotations

import io
from typing import Any

from shardsink.errors import ConditionFailedError
from shardsink.storage.base import SourceVersion

#: Bytes per request when a file is read front to back (CSV / JSONL), and the read-ahead of a
#: footer read (pyarrow asks for the last 64 KiB first).
BLOCK = 16 * 1024 * 1024


class SourceChangedError(ConditionFailedError):
    """The source object changed or vanished while it was being read in ranges."""


class RangedFile(io.RawIOBase):
    """A read-only, seekable view of source object ``key`` of ``blob`` as listed (``expect``)."""

    def __init__(self, blob: Any, key: str, expect: SourceVersion, *, block: int = BLOCK) -> None:
        super().__init__()
        self.blob, self.key, self.expect, self.block = blob, key, expect, block
        self.size = expect.size
        self.pos = 0
        self._buf = b""
        self._buf_at = 0
        #: Requests sent and bytes fetched (benchmarks read these).
        self.requests = 0
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _fetch(self, start: int, end: int) -> bytes:
        try:
            got = self.blob.get_source_range(self.key, start, end, expect=self.expect)
        except ConditionFailedError as e:
            raise SourceChangedError(str(e)) from e
        if got is None:
            raise SourceChangedError(f"{self.key} disappeared while it was being read")
        self.requests += 1
        self.fetched += len(got)
        return bytes(got)

    def prefetch(self, start: int, end: int) -> None:
        """Fetch ``[start, end)`` in one request; reads inside it are then served from memory."""
        start, end = max(0, start), min(self.size, end)
        if self._buf_at <= start and end <= self._buf_at + len(self._buf):
            return
        self._buf = b""  # release the old range before fetching the new one
        self._buf, self._buf_at = self._fetch(start, end), start

    def drop(self) -> None:
        """Release the buffered range."""
        self._buf, self._buf_at = b"", 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = max(0, min(n, self.size - self.pos))
        if n == 0:
            return b""
        lo, hi = self.pos, self.pos + n
        if not (self._buf_at <= lo and hi <= self._buf_at + len(self._buf)):
            # A miss: read ahead a block (sequential CSV / JSONL reads; a footer's last 64 KiB).
            self.prefetch(lo, max(hi, min(self.size, lo + self.block)) if n < self.block else hi)
        off = lo - self._buf_at
        out = self._buf[off:off + n]
        self.pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)
