"""A store that accepts ``If-None-Match`` / ``If-Match`` and ignores them, over real HTTP: a
:class:`~support.faultproxy.FaultProxy` in front of moto that drops those headers before
forwarding (issue 21: SeaweedFS #8800, versitygw #1708 behave so).

moto does not check SigV4 signatures, so the dropped (signed) headers go unnoticed upstream,
as they would on a server that ignores them. The proxy's log keeps the headers as the client
sent them, so tests can count the conditional requests.
"""

from __future__ import annotations

from support.faultproxy import FaultProxy

BOTH = ("if-none-match", "if-match")


class IgnoringProxy(FaultProxy):
    """Forwards every request to ``upstream`` without the ``ignored`` headers (lower-case names)."""

    def __init__(self, upstream: str, ignored: tuple[str, ...] = BOTH) -> None:
        super().__init__(upstream)
        self.ignored = ignored

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        kept = [(k, v) for k, v in headers if k.lower() not in self.ignored]
        return super()._forward(method, path, kept, body)
