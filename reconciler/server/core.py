"""The daemon's HTTP server: a stranger can reach it, so every resource a client can hold is bounded. I/O.

One selector thread per address reads requests from every connection without blocking; a connection
costs a file descriptor and its buffer, never a thread. A request reaches a worker only once it is
complete, and workers are fixed pools per route (operations: ``/metrics``, ``/healthz``; webhook;
pages), so a flood on one route cannot take the threads of another. Limits:

- the request head (line and headers) is at most ``MAX_HEAD`` bytes; a request must arrive within
  ``request_timeout`` seconds and make progress every ``read_timeout`` seconds (else 408);
- ``POST /hooks/git`` checks its signature header, ``Transfer-Encoding`` and ``Content-Length``
  before reading any body, and refuses bodies over ``max_body`` (413) unread; bodies being read by
  all connections together are capped at ``body_budget`` bytes (503 beyond);
- at most ``max_connections`` connections are open: a new one evicts the oldest still being read,
  so idle and slow clients cannot lock out the operators' scrapes;
- a full worker queue answers 503 at once; writes time out after ``write_timeout`` seconds, and a
  streamed (chunked) body stops when the client leaves.

Every connection carries one request (``Connection: close``).
"""

from __future__ import annotations

import contextlib
import http
import json
import logging
import queue
import re
import select
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reconciler.server.metrics import CONTENT_TYPE, Metrics
from reconciler.server.webhook import header_problem, pushed_ref, signature_ok
from reconciler.web.response import CLIENT_ADDRESS, CLIENT_USER, PageHandler, Response

log = logging.getLogger("argus.http")

MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
DEFAULT_MAX_BODY = 1024 * 1024
_DRAIN_SECONDS = 1.0
_DRAIN_BYTES = 1024 * 1024
_TOKEN_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# A user name as an authenticating proxy passes it (a login or an e-mail address); anything else is no identity.
_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")

_HEAD, _BODY, _DRAIN = 0, 1, 2


@dataclass
class Request:
    method: str
    target: str
    path: str
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes = b""
    reserved: int = 0  # bytes of the body budget this request holds until a worker is done with it


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    last: float
    state: int = _HEAD
    buf: bytearray = field(default_factory=bytearray)
    request: Request | None = None
    need: int = 0
    reserved: int = 0
    drain_until: float = 0.0
    drained: int = 0


class _RequestError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


def _json_body(status: int, message: str) -> bytes:
    key = "error" if status >= 400 else "message"
    return json.dumps({key: message}).encode()


def _head_bytes(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {status} {phrase}"]
    for name, value in headers:
        # Handler-supplied headers must not be able to split the response.
        if any(c in name + value for c in "\r\n\0") or not name:
            continue
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")


def _simple_response(
    status: int, body: bytes, content_type: str = "application/json", head_only: bool = False
) -> bytes:
    head = _head_bytes(
        status,
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            ("X-Content-Type-Options", "nosniff"),
        ],
    )
    return head if head_only else head + body


def parse_head(raw: bytes) -> Request:
    """Parse a request line and headers (``raw`` ends before the blank line). Raises _RequestError."""
    text = raw.decode("latin-1")
    lines = text.replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _RequestError(400, "malformed request line", "malformed")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _RequestError(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version", "malformed")
    if not set(method.encode()) <= _TOKEN_CHARS:
        raise _RequestError(400, "malformed method", "malformed")
    if len(lines) - 1 > MAX_HEADERS:
        raise _RequestError(431, "too many headers", "too_large")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name.encode("latin-1")) <= _TOKEN_CHARS:
            raise _RequestError(400, "malformed header line", "malformed")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if not target.startswith("/"):
        raise _RequestError(400, "request target must be a path", "malformed")
    raw_path, _, raw_query = target.partition("?")
    path = urllib.parse.unquote(raw_path, errors="replace")
    query = urllib.parse.parse_qs(raw_query, keep_blank_values=True, max_num_fields=100) if raw_query else {}
    return Request(method, target, path, query, version, headers)


def content_length(headers: dict[str, str]) -> int:
    """The declared body length. Raises _RequestError: 411 when absent or chunked, 400 when malformed."""
    if "transfer-encoding" in headers:
        raise _RequestError(411, "Transfer-Encoding is not accepted; send Content-Length", "no_length")
    declared = headers.get("content-length")
    if declared is None:
        raise _RequestError(411, "Content-Length required", "no_length")
    values = {v.strip() for v in declared.split(",")}
    value = values.pop()
    if values or not value.isascii() or not value.isdigit() or len(value) > 18:
        raise _RequestError(400, "malformed Content-Length", "malformed")
    return int(value)


class _Pool:
    """A fixed number of worker threads behind a bounded queue."""

    def __init__(self, name: str, threads: int, backlog: int, work: Callable[[socket.socket, Request], None]) -> None:
        self.queue: queue.Queue[tuple[socket.socket, Request] | None] = queue.Queue(backlog)
        self.work = work
        self.threads = [
            threading.Thread(target=self._run, name=f"argus-http-{name}-{i}", daemon=True) for i in range(threads)
        ]
        for t in self.threads:
            t.start()

    def offer(self, sock: socket.socket, request: Request) -> bool:
        try:
            self.queue.put_nowait((sock, request))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            sock, request = item
            try:
                self.work(sock, request)
            except Exception:  # a worker must survive any one request
                log.exception("http worker failed on %s %s", request.method, request.path)
            finally:
                with contextlib.suppress(OSError):
                    sock.close()

    def stop(self) -> None:
        for _ in self.threads:
            with contextlib.suppress(queue.Full):
                self.queue.put_nowait(None)


class HttpServer:
    """One listening address. ``shutdown()`` stops it; ``server_address`` is the bound ``(host, port)``."""

    def __init__(
        self,
        listen: str,
        *,
        metrics: Metrics,
        health: Callable[[], dict[str, Any]],
        on_push: Callable[[str | None], bool] | None,
        secret: str | None,
        pages: PageHandler | None,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = 5.0,
        request_timeout: float = 15.0,
        write_timeout: float = 10.0,
        max_connections: int = 512,
        body_budget: int = 16 * 1024 * 1024,
        page_threads: int = 8,
        user_header: str | None = None,
        user_header_from: Iterable[str] = (),
    ) -> None:
        self.metrics, self.health, self.on_push, self.secret, self.pages = metrics, health, on_push, secret, pages
        self.max_body, self.read_timeout, self.request_timeout = max_body, read_timeout, request_timeout
        self.write_timeout, self.max_connections = write_timeout, max_connections
        self.body_budget = max(body_budget, max_body)
        # The header an authenticating proxy in front of the pages names its user in (None: none).
        self.user_header = user_header.strip().lower() if user_header and user_header.strip() else None
        # Where that header is believed from (empty: from every client, the proxy being the only way in).
        self.user_header_from = TrustedPeers(tuple(user_header_from)) if user_header_from else None
        self.reserved = 0
        self.reserved_lock = threading.Lock()
        self.conns: dict[socket.socket, _Conn] = {}
        self.listener = _bind(listen)
        self.listener.setblocking(False)
        self.server_address: tuple[str, int] = self.listener.getsockname()[:2]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.stopping = threading.Event()
        self.ops = _Pool("ops", 2, 32, self._serve_ops)
        self.hooks = _Pool("hook", 2, 32, self._serve_hook)
        self.page_pool = _Pool("pages", page_threads, 32, self._serve_page) if pages is not None else None
        self.thread = threading.Thread(target=self._loop, name="argus-http", daemon=True)
        self.thread.start()

    # -- the selector thread -------------------------------------------------------------------

    def _loop(self) -> None:
        last_sweep = time.monotonic()
        while not self.stopping.is_set():
            try:
                events = self.selector.select(timeout=0.2)
            except OSError:
                continue
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._readable(key.data)
            now = time.monotonic()
            if now - last_sweep >= 0.2:
                last_sweep = now
                self._sweep(now)
        for conn in list(self.conns.values()):
            self._close(conn)
        self.selector.close()
        self.listener.close()

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and friends: shed the oldest reader and retry on the next event
                self._evict_oldest()
                return
            sock.setblocking(False)
            if len(self.conns) >= self.max_connections:
                self._evict_oldest()
            now = time.monotonic()
            conn = _Conn(sock, now, now)
            self.conns[sock] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def _evict_oldest(self) -> None:
        for conn in self.conns.values():  # insertion order: the oldest first
            self.metrics.http_rejected("evicted")
            self._close(conn)
            return

    def _readable(self, conn: _Conn) -> None:
        try:
            room = MAX_HEAD + 1 - len(conn.buf) if conn.state == _HEAD else max(conn.need - len(conn.buf), 1)
            data = conn.sock.recv(min(max(room, 1), 256 * 1024))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.last = time.monotonic()
        if conn.state == _DRAIN:
            conn.drained += len(data)
            if conn.drained > _DRAIN_BYTES:
                self._close(conn)
            return
        conn.buf += data
        try:
            if conn.state == _HEAD:
                self._on_head_data(conn)
            elif conn.state == _BODY and len(conn.buf) >= conn.need:
                self._body_complete(conn)
        except _RequestError as exc:
            self._refuse(conn, exc)

    def _on_head_data(self, conn: _Conn) -> None:
        end = conn.buf.find(b"\r\n\r\n")
        sep = 4
        if end < 0:
            end, sep = conn.buf.find(b"\n\n"), 2
        if end < 0:
            if len(conn.buf) > MAX_HEAD:
                raise _RequestError(431, "request head too large", "too_large")
            return
        if end > MAX_HEAD:
            raise _RequestError(431, "request head too large", "too_large")
        request = parse_head(bytes(conn.buf[:end]))
        conn.request = request
        del conn.buf[: end + sep]
        self._route(conn, request)

    def _route(self, conn: _Conn, request: Request) -> None:
        if request.method in ("GET", "HEAD"):
            if request.headers.get("content-length", "0").strip() not in ("", "0") or (
                "transfer-encoding" in request.headers
            ):
                raise _RequestError(400, f"{request.method} takes no body", "malformed")
            if request.path in ("/metrics", "/healthz"):
                self._dispatch(conn, self.ops, request)
            elif self.page_pool is not None:
                self._dispatch(conn, self.page_pool, request)
            else:
                raise _RequestError(404, "not found", "not_found")
            return
        if request.method == "POST" and request.path == "/hooks/git" and self.on_push is not None:
            self._start_hook(conn, request)
            return
        if request.method == "POST" and self.page_pool is None:
            raise _RequestError(404, "not found", "not_found")
        # The pages are read-only: git is the only input.
        raise _RequestError(405, "method not allowed", "method")

    def _start_hook(self, conn: _Conn, request: Request) -> None:
        # Everything that can refuse the request is decided here, before one byte of body is read.
        if not self.secret:
            raise _RequestError(403, "webhook disabled: set ARGUS_WEBHOOK_SECRET", "disabled")
        problem = header_problem(request.headers)
        if problem is not None:
            self.metrics.error("webhook_signature")
            raise _RequestError(401, problem, "signature")
        length = content_length(request.headers)
        if length > self.max_body:
            raise _RequestError(413, f"body over {self.max_body} bytes", "too_large")
        with self.reserved_lock:
            if self.reserved + length > self.body_budget:
                raise _RequestError(503, "busy: too many webhook bodies in flight", "busy")
            self.reserved += length
        conn.reserved = length
        conn.need = length
        conn.state = _BODY
        if request.headers.get("expect", "").lower() == "100-continue" and len(conn.buf) < length:
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(conn.buf) >= length:
            self._body_complete(conn)

    def _body_complete(self, conn: _Conn) -> None:
        assert conn.request is not None
        conn.request.body = bytes(conn.buf[: conn.need])
        conn.buf = bytearray()
        self._dispatch(conn, self.hooks, conn.request)

    def _dispatch(self, conn: _Conn, pool: _Pool, request: Request) -> None:
        self._forget(conn)
        request.reserved = conn.reserved  # the worker releases it when the request is done
        if not pool.offer(conn.sock, request):
            self.metrics.http_rejected("busy")
            self._release(conn)
            _send_nowait(conn.sock, _simple_response(503, _json_body(503, "busy, retry later")))
            with contextlib.suppress(OSError):
                conn.sock.close()
            return

    def _refuse(self, conn: _Conn, exc: _RequestError) -> None:
        """Answer an error without reading further, then discard what the client still sends for a moment
        (closing with unread data would reset the connection before the client sees the answer)."""
        self.metrics.http_rejected(exc.reason)
        self._release(conn)
        head_only = conn.request is not None and conn.request.method == "HEAD"
        _send_nowait(conn.sock, _simple_response(exc.status, _json_body(exc.status, str(exc)), head_only=head_only))
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        conn.state = _DRAIN
        conn.buf = bytearray()
        conn.drain_until = time.monotonic() + _DRAIN_SECONDS

    def _sweep(self, now: float) -> None:
        for conn in list(self.conns.values()):
            if conn.state == _DRAIN:
                if now >= conn.drain_until:
                    self._close(conn)
            elif now - conn.last > self.read_timeout or now - conn.opened > self.request_timeout:
                self._refuse(conn, _RequestError(408, "request timeout", "timeout"))
                conn.drain_until = now  # the client was too slow already; close on the next sweep

    def _forget(self, conn: _Conn) -> None:
        self.conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(conn.sock)

    def _close(self, conn: _Conn) -> None:
        self._forget(conn)
        self._release(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _release(self, conn: _Conn) -> None:
        if conn.reserved:
            self._unreserve(conn.reserved)
            conn.reserved = 0

    def _unreserve(self, n: int) -> None:
        with self.reserved_lock:
            self.reserved -= n

    # -- workers -------------------------------------------------------------------------------

    def _send(self, sock: socket.socket, data: bytes) -> None:
        sock.settimeout(self.write_timeout)
        sock.sendall(data)

    def _serve_ops(self, sock: socket.socket, request: Request) -> None:
        head_only = request.method == "HEAD"
        if request.path == "/metrics":
            body, ctype, status = self.metrics.render().encode(), CONTENT_TYPE, 200
        else:
            try:
                state = self.health()
                status = 200 if state.get("ok") else 503
            except Exception as exc:  # health must answer even when the daemon is broken
                log.exception("health check failed")
                state, status = {"ok": False, "last_error": type(exc).__name__}, 500
            body, ctype = json.dumps(state, default=str).encode(), "application/json"
        self._send(sock, _simple_response(status, body, ctype, head_only))

    def _serve_hook(self, sock: socket.socket, request: Request) -> None:
        try:
            assert self.secret is not None and self.on_push is not None
            if not signature_ok(request.headers, request.body, self.secret):
                self.metrics.error("webhook_signature")
                response = _simple_response(401, _json_body(401, "bad signature"))
            else:
                try:
                    relevant = self.on_push(pushed_ref(request.body))
                    response = _simple_response(202, json.dumps({"accepted": relevant, "time": time.time()}).encode())
                except Exception:  # the git host gets an answer; the traceback goes to the log only
                    log.exception("webhook trigger failed")
                    response = _simple_response(500, _json_body(500, "internal error"))
            request.body = b""
        finally:
            self._unreserve(request.reserved)
        self._send(sock, response)

    def _serve_page(self, sock: socket.socket, request: Request) -> None:
        assert self.pages is not None
        try:
            peer = sock.getpeername()
            CLIENT_ADDRESS.set(str(peer[0]) if isinstance(peer, tuple) else "")
        except OSError:
            CLIENT_ADDRESS.set("")
        trusted = self.user_header_from is None or self.user_header_from.allows(CLIENT_ADDRESS.get())
        CLIENT_USER.set(vouched_user(request.headers, self.user_header) if trusted else "")
        try:
            response = self.pages(request.method, request.path, request.query)
        except Exception:
            log.exception("page handler failed on %s", request.path)
            response = Response(500, "application/json", _json_body(500, "internal error"))
        if response is None:
            response = Response(404, "application/json", _json_body(404, "not found"))
        self._write_response(sock, request, response)

    def _write_response(self, sock: socket.socket, request: Request, response: Response) -> None:
        head_only = request.method == "HEAD"
        extra = [(k, v) for k, v in response.headers.items() if k.lower() not in _SERVER_HEADERS]
        base = [("Content-Type", response.content_type), ("Connection", "close"), ("X-Content-Type-Options", "nosniff")]
        if isinstance(response.body, bytes | bytearray):
            body = bytes(response.body)
            head = _head_bytes(response.status, [*base, ("Content-Length", str(len(body))), *extra])
            self._send(sock, head if head_only else head + body)
            return
        chunks = iter(response.body)
        try:
            chunked = request.version == "HTTP/1.1"
            framing = [("Transfer-Encoding", "chunked")] if chunked else []
            self._send(sock, _head_bytes(response.status, [*base, ("Cache-Control", "no-cache"), *framing, *extra]))
            if head_only:
                return
            for chunk in chunks:
                if self.stopping.is_set() or _peer_gone(sock):
                    return
                if not chunk:  # an empty item is a heartbeat: it only checks that the client is still there
                    continue
                self._send(sock, b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                self._send(sock, b"0\r\n\r\n")
        except OSError:
            return  # the client left or stopped reading (write timeout): stop streaming
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def shutdown(self) -> None:
        """Stop accepting, close every connection being read, stop the workers (a running one finishes)."""
        self.stopping.set()
        self.thread.join(timeout=5)
        for pool in (self.ops, self.hooks, self.page_pool):
            if pool is not None:
                pool.stop()

    server_close = shutdown


_SERVER_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "content-type"})


class TrustedPeers:
    """The addresses of named hosts (a proxy, compose's git server) whose user header is believed.

    Names are resolved again after ``ttl`` seconds (a recreated container gets a new address); a name
    that does not resolve lends no trust until it does. The one cache of resolved addresses is this
    object's, bounded by the names given (each resolves to a handful of addresses).
    """

    def __init__(self, names: tuple[str, ...], ttl: float = 30.0) -> None:
        self.names, self.ttl = names, ttl
        self._addresses: frozenset[str] = frozenset()
        self._resolved_at = float("-inf")
        self._lock = threading.Lock()

    def allows(self, address: str) -> bool:
        """Whether ``address`` (a peer's IP as the socket reports it) is one of the names' addresses now."""
        if not address:
            return False
        with self._lock:
            if time.monotonic() - self._resolved_at > self.ttl:
                self._addresses, self._resolved_at = self._resolve(), time.monotonic()
            addresses = self._addresses
        return address in addresses or address.removeprefix("::ffff:") in addresses

    def _resolve(self) -> frozenset[str]:
        found: set[str] = set()
        for name in self.names:
            try:
                found.update(str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP))
            except (OSError, UnicodeError):
                log.warning("--web-user-header-from: %s does not resolve; its user header is not believed", name)
        return frozenset(found)


def vouched_user(headers: dict[str, str], header: str | None) -> str:
    """The user named in ``header`` (lower case) of ``headers``, as an authenticating proxy sets it;
    "" when no header is configured, or the request has none or one that is not a plain user name
    (repeated, it was joined with ", ": not one user either)."""
    if header is None:
        return ""
    value = headers.get(header, "").strip()
    return value if _USER.fullmatch(value) else ""


def _peer_gone(sock: socket.socket) -> bool:
    """True when the client closed its side (readable with EOF) or the socket failed."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        sock.settimeout(0)
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
    except (OSError, ValueError):
        return True


def _send_nowait(sock: socket.socket, data: bytes) -> None:
    """Send what the socket buffer takes now (a fresh connection takes a small answer whole)."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(data)


def _bind(listen: str) -> socket.socket:
    """A listening socket for ``host:port`` (``[v6]:port`` for IPv6; an empty host means all addresses)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"listen address {listen!r} is not HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port_text)))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock
