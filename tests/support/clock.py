"""Test time without sleeping: objects made "old" on demand, and line handshakes with processes.

:class:`Backdated` replaces sleeping past the store's clock resolution (S3's LastModified is
whole seconds, so two objects written within one second cannot be told apart by age): a
test calls :meth:`Backdated.backdate` where it would have slept, and every object that exists
then is listed as ``seconds`` older; one written (or rewritten) afterwards lists its real
time. Only listings carry modification times (:class:`shardsink.storage.base.Blob`), so GC,
verify and the leftover listings see the shifted ages; the bytes are the store's own.

:func:`await_line` / :func:`release` order steps with a child process over its stdin/stdout pipes
(the child prints a word on a line of its own and blocks on ``sys.stdin.readline()``): the
parent wakes when the child gets there, never after a guessed delay.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator, Sequence

from shardsink.storage.base import Blob, Fetched, ObjectInfo, SourceObject, SourceVersion


class Backdated:
    """A Blob over ``inner`` whose listings show objects present at :meth:`backdate` as older.

    An object counts as the one that was backdated while its listed size, modification time
    and identity are unchanged: one rewritten afterwards, through any handle, lists its real
    time (a rewrite within S3's same second changes the ETag unless the bytes are equal)."""

    def __init__(self, inner: Blob) -> None:
        self.inner, self.url = inner, inner.url
        self._shift: dict[tuple[str, int, float, str], float] = {}

    def backdate(self, seconds: float = 3600.0) -> None:
        """From now on, list every object that exists now as ``seconds`` older than it is."""
        for o in self.inner.list(""):
            self._shift[(o.key, o.size, o.modified, o.identity)] = seconds

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for o in self.inner.list(prefix):
            by = self._shift.get((o.key, o.size, o.modified, o.identity))
            yield o if by is None else dataclasses.replace(o, modified=o.modified - by)

    def get(self, key: str) -> Fetched | None:
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def create(self, key: str, data: bytes) -> str:
        return self.inner.create(key, data)

    def replace(self, key: str, data: bytes, *, etag: str | None) -> str:
        return self.inner.replace(key, data, etag=etag)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def get_source(self, key: str) -> SourceObject | None:
        return self.inner.get_source(key)

    def get_source_range(self, key: str, start: int, end: int, *, expect: SourceVersion) -> bytes | None:
        return self.inner.get_source_range(key, start, end, expect=expect)


def await_line(proc: subprocess.Popen[str], word: str) -> None:
    """Block until ``proc`` (stdout a text pipe) prints the line ``word``; fails, with what it
    printed, if it exits first. Lines before ``word`` are dropped.

    SUBTLE: ``communicate()`` reads the pipe's file descriptor, not this buffered reader: a
    child must print nothing after ``word`` until it is released, or that output is lost."""
    assert proc.stdout is not None
    printed: list[str] = []
    for line in iter(proc.stdout.readline, ""):
        if line.rstrip("\n") == word:
            return
        printed.append(line)
    err = proc.stderr.read() if proc.stderr is not None else ""
    raise AssertionError(f"the process exited ({proc.wait()}) before printing {word!r}: "
                         f"{''.join(printed)[-3000:]}{err[-3000:]}")


def release(proc: subprocess.Popen[str], word: str = "go") -> None:
    """Write the line ``word`` to ``proc``'s stdin (a text pipe): the child's readline returns."""
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()
