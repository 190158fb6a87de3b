"""A programmable fault-injecting HTTP reverse proxy for S3 (moto) on 127.0.0.1.

Placed between boto3 and a real S3 endpoint, it forwards every request unchanged
(same path, headers and body; the SigV4 signature stays valid because the Host header
is kept) and, when a :class:`Rule` matches, injects one fault:

``drop_response_after_forward``
    forward the request (it is applied upstream), then close the client connection
    without an answer: botocore sees a closed connection (unknown outcome).
``status_before_forward``
    answer ``status`` with an S3-style XML error body; nothing reaches upstream.
``status_after_forward``
    forward (applied), discard the upstream answer, answer ``status`` instead.
``delay``
    sleep ``seconds`` before (``phase="before"``) or after (``phase="after"``)
    forwarding; with a client read timeout below ``seconds`` this is a timeout whose
    request did (after) or did not yet (before) reach upstream.
``call_before_forward``
    run ``action`` (in-process rules only), then forward normally. Tests use it to
    make another writer win a race at an exact point of the protocol.

Rules match on method, a regex searched in the object key (plus ``?query`` when there
is one), an optional request header that must be present, and the occurrence: a rule
fires on matching requests number ``nth`` .. ``nth + times - 1`` (1-based; ``times``
None = forever), optionally only with ``probability`` (seeded, for chaos runs). The
first rule that fires wins; each request gets at most one fault.

Every request is logged (:class:`Request`: method, key, headers such as
``If-None-Match``/``If-Match``, the upstream status, the fault applied) so tests can
count requests. Rules can be programmed in-process (:meth:`FaultProxy.add`) or over
HTTP by another process: ``POST /__faults__`` with ``{"rules": [...], "clear": bool}``,
``GET /__faults__`` (rules and log as JSON), ``DELETE /__faults__`` (clear all).

SUBTLE: moto's ``If-None-Match``/``If-Match`` checks are check-then-act without a lock,
so two concurrent conditional puts on one key can both succeed, which real S3 never
allows. With ``atomic_conditional_puts`` (the default) the proxy forwards conditional
PUTs one at a time, restoring S3's semantics for concurrency tests. Faults and delays
happen outside that critical section.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

Kind = Literal[
    "drop_response_after_forward",
    "status_before_forward",
    "status_after_forward",
    "delay",
    "call_before_forward",
]
KINDS: tuple[str, ...] = (
    "drop_response_after_forward",
    "status_before_forward",
    "status_after_forward",
    "delay",
    "call_before_forward",
)
CONTROL = "/__faults__"

#: S3 error codes used for injected statuses.
S3_CODES = {
    409: "ConditionalRequestConflict",
    412: "PreconditionFailed",
    500: "InternalError",
    503: "SlowDown",
}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


@dataclass
class Rule:
    """One fault: what it matches, which occurrences, and what it does."""

    kind: Kind
    method: str = "PUT"
    key: str = ".*"
    header: str | None = None
    nth: int = 1
    times: int | None = 1
    status: int = 500
    code: str | None = None
    seconds: float = 0.0
    phase: Literal["before", "after"] = "after"
    probability: float | None = None
    action: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {KINDS}")
        if self.nth < 1:
            raise ValueError(f"nth must be >= 1, got {self.nth}")
        self._key = re.compile(self.key)

    def matches(self, req: Request) -> bool:
        if self.method != "*" and req.method != self.method.upper():
            return False
        if self.header is not None and self.header.lower() not in req.headers:
            return False
        target = f"{req.key}?{req.query}" if req.query else req.key
        return self._key.search(target) is not None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "action" and not k.startswith("_")}


@dataclass
class Request:
    """One proxied request, as logged. ``headers`` are lower-cased names."""

    seq: int
    method: str
    key: str
    query: str
    headers: dict[str, str]
    fault: str | None = None
    upstream_status: int | None = None  # None: not forwarded (or forwarding failed)
    client_status: int | None = None  # None: no answer was sent
    started: float = 0.0
    finished: float | None = None

    @property
    def if_none_match(self) -> str | None:
        return self.headers.get("if-none-match")

    @property
    def if_match(self) -> str | None:
        return self.headers.get("if-match")


def _error_body(status: int, code: str, resource: str, seq: int) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by faultproxy (HTTP {status})</Message>"
        f"<Resource>{resource}</Resource><RequestId>faultproxy-{seq}</RequestId></Error>"
    ).encode()


class FaultProxy:
    """A threaded reverse proxy to ``upstream`` with programmable faults; see the module doc."""

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        atomic_conditional_puts: bool = True,
        seed: int = 0,
    ) -> None:
        u = urlsplit(upstream)
        if u.scheme != "http" or not u.hostname or not u.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (u.hostname, u.port)
        self.atomic_conditional_puts = atomic_conditional_puts
        self._rules: list[Rule] = []
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._conditional = threading.Lock()
        self._idle = threading.Condition()
        self._changed = threading.Condition()  # notified when a request is logged or its upstream status set
        self._inflight = 0
        self._rng = random.Random(seed)
        self._server = _Server((host, port), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- programming ----------------------------------------------------------------

    def add(self, kind: Kind, **kw: Any) -> Rule:
        """Add a rule (see :class:`Rule` for the fields) and return it."""
        rule = Rule(kind, **kw)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self, *, log: bool = True) -> None:
        """Remove every rule (and, by default, forget the request log)."""
        with self._lock:
            self._rules.clear()
            if log:
                self._log.clear()

    def clear_rules(self) -> None:
        self.clear(log=False)

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def requests(
        self,
        method: str | None = None,
        key: str | None = None,
        *,
        header: str | None = None,
        fault: str | None = None,
    ) -> list[Request]:
        """Logged requests filtered by method, key regex (searched), header present, fault."""
        pat = re.compile(key) if key is not None else None
        with self._lock:
            log = list(self._log)
        return [
            r
            for r in log
            if (method is None or r.method == method.upper())
            and (pat is None or pat.search(r.key))
            and (header is None or header.lower() in r.headers)
            and (fault is None or r.fault == fault)
        ]

    def count(self, method: str | None = None, key: str | None = None, *, header: str | None = None) -> int:
        return len(self.requests(method, key, header=header))

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until no request is being handled (delayed requests included)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"faultproxy still has {self._inflight} requests in flight")
                self._idle.wait(left)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Block until ``predicate()`` (typically over :meth:`requests`) holds, re-checking it
        each time a request is logged or gets its upstream status; False on ``timeout``."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _notify(self) -> None:
        # SUBTLE: never called with ``_lock`` held: a waiter holds ``_changed`` while its
        # predicate takes ``_lock``.
        with self._changed:
            self._changed.notify_all()

    # --- the data path --------------------------------------------------------------

    def _pick(self, req: Request) -> Rule | None:
        with self._lock:
            chosen: Rule | None = None
            for rule in self._rules:
                if not rule.matches(req):
                    continue
                rule.seen += 1
                if chosen is not None or rule.seen < rule.nth:
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if rule.probability is not None and self._rng.random() >= rule.probability:
                    continue
                rule.fired += 1
                chosen = rule
            req.fault = chosen.kind if chosen is not None else None
            req.seq = len(self._log) + 1
            self._log.append(req)
            return chosen

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> tuple[
        int, str, list[tuple[str, str]], bytes
    ]:
        conditional = method == "PUT" and any(k.lower() in ("if-none-match", "if-match") for k, _ in headers)
        lock = self._conditional if conditional and self.atomic_conditional_puts else None
        if lock is not None:
            lock.acquire()
        try:
            conn = http.client.HTTPConnection(*self.upstream, timeout=60)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    conn.putheader(k, v)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            finally:
                conn.close()
        finally:
            if lock is not None:
                lock.release()

    def handle(self, h: _Handler, body: bytes) -> None:
        split = urlsplit(h.path)
        path = unquote(split.path)
        parts = path.lstrip("/").split("/", 1)
        key = parts[1] if len(parts) == 2 else ""
        headers = [(k, v) for k, v in h.headers.items() if k.lower() not in _HOP_BY_HOP]
        req = Request(
            seq=0,
            method=h.command,
            key=key,
            query=unquote(split.query),
            headers={k.lower(): v for k, v in headers},
            started=time.monotonic(),
        )
        with self._idle:
            self._inflight += 1
        try:
            self._serve(h, req, headers, body)
        finally:
            req.finished = time.monotonic()
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _serve(self, h: _Handler, req: Request, headers: list[tuple[str, str]], body: bytes) -> None:
        rule = self._pick(req)
        self._notify()
        kind = rule.kind if rule is not None else None
        if rule is not None and rule.action is not None and kind in ("status_before_forward", "call_before_forward"):
            rule.action()
        if rule is not None and kind == "delay" and rule.phase == "before":
            time.sleep(rule.seconds)  # not ordering: the fault itself, a slow answer
        if rule is not None and kind == "status_before_forward":
            self._answer_error(h, req, rule)
            return
        try:
            status, reason, up_headers, data = self._forward(req.method, h.path, headers, body)
        except OSError as e:
            req.upstream_status = None
            self._notify()
            self._answer_error(h, req, Rule("status_before_forward", status=502, code=f"BadGateway:{e}"))
            return
        req.upstream_status = status
        self._notify()
        if rule is not None and rule.action is not None and kind not in ("status_before_forward",
                                                                          "call_before_forward"):
            rule.action()
        if rule is not None and kind == "delay" and rule.phase == "after":
            time.sleep(rule.seconds)  # not ordering: the fault itself, a slow answer
        if rule is not None and kind == "drop_response_after_forward":
            h.drop()
            return
        if rule is not None and kind == "status_after_forward":
            self._answer_error(h, req, rule)
            return
        h.answer(status, reason, up_headers, data)
        req.client_status = status

    def _answer_error(self, h: _Handler, req: Request, rule: Rule) -> None:
        code = rule.code or S3_CODES.get(rule.status, "InternalError")
        body = _error_body(rule.status, code, "/" + req.key, req.seq)
        h.answer(rule.status, http.client.responses.get(rule.status, "Error"),
                 [("Content-Type", "application/xml")], body)
        req.client_status = rule.status

    # --- control endpoint -------------------------------------------------------------

    def control(self, h: _Handler, body: bytes) -> None:
        try:
            if h.command == "POST":
                spec = json.loads(body or b"{}")
                if spec.get("clear"):
                    self.clear()
                added = [self.add(**r) for r in spec.get("rules", [])]
                out: Any = {"added": len(added)}
            elif h.command == "DELETE":
                self.clear()
                out = {"cleared": True}
            else:
                out = {
                    "rules": [r.to_json() for r in self.rules],
                    "log": [asdict(r) for r in self.requests()],
                }
            data, status = json.dumps(out).encode(), 200
        except (ValueError, TypeError) as e:
            data, status = json.dumps({"error": str(e)}).encode(), 400
        h.answer(status, "OK" if status == 200 else "Bad Request", [("Content-Type", "application/json")], data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # one answer = one write; no delayed-ACK stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _dispatch(self) -> None:
        body = self._body()
        if self.path.startswith(CONTROL):
            self.server.proxy.control(self, body)
        else:
            self.server.proxy.handle(self, body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _dispatch

    def answer(self, status: int, reason: str, headers: Iterable[tuple[str, str]], data: bytes) -> None:
        lines = [f"{self.protocol_version} {status} {reason}"]
        length = str(len(data))
        for k, v in headers:
            if k.lower() in _HOP_BY_HOP:
                if self.command == "HEAD" and k.lower() == "content-length":
                    length = v
                continue
            lines.append(f"{k}: {v}")
        lines.append(f"Content-Length: {length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(head + (data if self.command != "HEAD" else b""))
            self.wfile.flush()
        except OSError:
            # The client gave up (read timeout): nothing to answer to.
            self.close_connection = True

    def drop(self) -> None:
        """Close the client connection without sending a byte of the answer."""
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


@contextmanager
def fault_proxy(upstream: str, **kw: Any) -> Iterator[FaultProxy]:
    """Run a :class:`FaultProxy` to ``upstream`` for the duration of the block."""
    proxy = FaultProxy(upstream, **kw).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def program(proxy_url: str, rules: list[dict[str, Any]], *, clear: bool = False) -> None:
    """Program a proxy running elsewhere (another process) through its control endpoint."""
    data = json.dumps({"rules": rules, "clear": clear}).encode()
    req = urllib.request.Request(f"{proxy_url}{CONTROL}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def fetch_log(proxy_url: str) -> list[dict[str, Any]]:
    """The request log of a proxy running elsewhere."""
    with urllib.request.urlopen(f"{proxy_url}{CONTROL}", timeout=10) as r:
        return list(json.loads(r.read())["log"])
