"""Local-folder backend: the embedded default (``file:///abs/path/shard``).

Writes go to a temporary file in the target's folder, are fsynced, then published:
``put`` with ``os.replace`` (atomic overwrite), ``create`` with ``os.link`` (atomic and
exclusive: it fails if the name exists, which is the conditional put). ``replace``
serialises check-and-swap under an ``flock`` so it is atomic across processes on one
host. Works on any POSIX filesystem with hard links; not on NFS without lock support.

Source files (landed files, read with ``get_source``) have a **content identity**,
``sha256:<hex>`` of their bytes: it changes whenever the bytes change and comes back when
the exact bytes are restored (a copy or re-upload gets a new mtime, not a new identity).
A listing never reads files, so ``list`` gives no identity (""): a caller that needs one
reads the file (``get_source``), once, when it binds it.

Bindings recorded before content identities hold ``<mtime ns hex>-<size hex>``
(:func:`_stat_identity`). Such an identity is checked as it was recorded: against the
file's current mtime and size (``SourceObject.legacy``). It cannot be checked against the
content (no hash was recorded), and the size alone would pass a same-size rewrite; so a
file bound that way is recovered by restoring its bytes *and* its mtime (the identity's
first field, nanoseconds: ``os.utime(path, ns=(m, m))``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from shardsink.errors import ConditionFailedError, StorageError
from shardsink.storage.base import Fetched, ObjectInfo, SourceObject, SourceVersion, check_key, check_source_key

_TMP_PREFIX = ".tmp-"
_LOCKS = ".locks"


def _etag(st: os.stat_result, data: bytes) -> str:
    # Inode + mtime alone can repeat (an inode reused within one timestamp tick), so the
    # content's checksum is part of it: equal etags then mean equal bytes.
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}-{zlib.crc32(data):08x}"


def _identity(data: bytes) -> str:
    """A source file's identity: its content's SHA-256 (~1.7 GB/s on one core with SHA extensions)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _stat_identity(st: os.stat_result) -> str:
    """The identity bindings recorded before content identities: mtime (ns) and size."""
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


#: How far a file's mtime may lag this host's precise clock (Linux stamps from a coarse clock
#: updated once a tick, 1 to 10 ms); generous, since it only widens what a listing records as held.
MTIME_LAG_S = 0.05


class LocalBlob:
    """Blob store over one folder; see the module docstring for the guarantees."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> Fetched | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
                return Fetched(data, _etag(st, data))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None
        except OSError as e:
            raise StorageError(f"cannot read {path}: {e}") from e

    def _write_temp(self, path: Path, data: bytes) -> Path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return tmp
        except OSError as e:
            raise StorageError(f"cannot write {path}: {e}", retryable=False) from e

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        os.replace(tmp, path)
        return _etag(os.stat(path), data)

    def create(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError as e:
            raise ConditionFailedError(f"{path} already exists") from e
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(os.stat(path), data)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        path = self._path(key)
        lock = self.root / _LOCKS / hashlib.sha1(key.encode()).hexdigest()
        lock.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_temp(path, data)
        try:
            with open(lock, "a+b") as lf:
                fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
                try:
                    with open(path, "rb") as cf:
                        current: str | None = _etag(os.fstat(cf.fileno()), cf.read())
                except FileNotFoundError:
                    current = None
                if current != etag:
                    raise ConditionFailedError(f"{path} changed (etag {current}, expected {etag})")
                os.replace(tmp, path)
                return _etag(os.stat(path), data)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.delete(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self.root / check_key(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                p = Path(dirpath) / name
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                yield ObjectInfo(p.relative_to(self.root).as_posix(), st.st_size, st.st_mtime)

    def clock(self) -> float:
        """This host's clock less :data:`MTIME_LAG_S`: the file system stamps mtimes from a coarse
        clock that may lag the precise one by a tick (``Blob.clock``)."""
        return time.time() - MTIME_LAG_S

    def get_source(self, key: str) -> SourceObject | None:
        path = self.root / check_source_key(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
                return SourceObject(data, _identity(data), legacy=_stat_identity(st))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"cannot read {path}: {e}") from e

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        """Bytes ``[start, end)`` of a source file, from ONE open file: its size and mtime are
        checked against ``expect`` on that descriptor (ConditionFailedError if they differ)."""
        path = self.root / check_source_key(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size != expect.size or st.st_mtime != expect.modified:
                    raise ConditionFailedError(
                        f"{path} changed since it was listed ({st.st_size} bytes, mtime {st.st_mtime}; listed "
                        f"{expect.size} bytes, mtime {expect.modified})")
                f.seek(max(0, start))
                return f.read(max(0, end - max(0, start)))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"cannot read {path}: {e}") from e
