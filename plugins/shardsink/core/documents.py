"""Stored JSON documents beside the state: one decoder and one canonical encoder.

Every stored document is a msgspec Struct with a ``format`` field. Readers ignore
unknown fields (msgspec's default), so a newer writer's additions do not break an older
reader; a format newer than the reader knows, a missing or mistyped field, or bytes that
are not JSON are a CorruptionError naming the object.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from shardsink.errors import CorruptionError

#: Canonical JSON: keys sorted at every level, no spaces.
ENCODER = msgspec.json.Encoder(order="sorted")

D = TypeVar("D", bound=msgspec.Struct)


class _Format(msgspec.Struct):
    format: int | None = None


def decode_doc(data: bytes, kind: type[D], *, what: str, where: str, newest: int,
               default_format: int | None = None) -> D:
    """Decode a stored ``what`` document as ``kind``; CorruptionError naming ``where`` if it
    is unreadable or its format is newer than ``newest``. ``default_format``: the format of
    documents written before they carried one (None: a missing format is corruption)."""
    try:
        fmt = msgspec.json.decode(data, type=_Format).format
    except msgspec.DecodeError as e:
        raise CorruptionError(f"{where}: unreadable {what} ({e})") from e
    if fmt is None:
        fmt = default_format
    if fmt is None or fmt < 1 or fmt > newest:
        raise CorruptionError(
            f"{where}: unsupported {what} format {fmt!r} (this shardsink reads formats 1..{newest}; "
            "a newer shardsink wrote it: upgrade)"
        )
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as e:
        raise CorruptionError(f"{where}: unreadable {what} ({e})") from e
