"""The daemon's HTTP server on a loopback port: webhook header handling, sizes, timeouts, pages, streaming.

The server is the real one (reconciler.server.start_server) with a real Metrics; requests are raw
sockets so that every malformed byte is the test's choice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconciler.server import Metrics, start_server
from reconciler.server.core import HttpServer
from reconciler.web.response import Response

SECRET = "s3cret-webhook"
BODY = json.dumps({"ref": "refs/heads/main"}).encode()
GOOD = "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()


@dataclass
class Served:
    server: HttpServer
    metrics: Metrics
    pushes: list[str | None] = field(default_factory=list)
    stream_closed: threading.Event = field(default_factory=threading.Event)

    @property
    def addr(self) -> tuple[str, int]:
        return self.server.server_address


def _pages(served: Served) -> Any:
    def handler(method: str, path: str, query: Mapping[str, list[str]]) -> Response | None:
        if path == "/hello":
            return Response(200, "text/plain", b"hello " + ",".join(query.get("who", [])).encode(), {"X-Extra": "1"})
        if path == "/boom":
            raise RuntimeError("handler bug")
        if path == "/stream":
            return Response(200, "text/plain", _stream(served, int(query.get("n", ["3"])[0])))
        if path == "/evil-header":
            return Response(200, "text/plain", b"x", {"X-Bad": "a\r\nSet-Cookie: pwned=1"})
        return None

    return handler


def _stream(served: Served, n: int) -> Iterator[bytes]:
    try:
        for i in range(n):
            yield f"line {i}\n".encode()
            time.sleep(0.05)
        while n == 0:  # follow forever, as a live log does, with heartbeats
            yield b""
            time.sleep(0.05)
    finally:
        served.stream_closed.set()


@pytest.fixture
def served() -> Iterator[Served]:
    metrics = Metrics()
    served = Served(server=None, metrics=metrics)  # type: ignore[arg-type]

    def on_push(ref: str | None) -> bool:
        served.pushes.append(ref)
        return ref == "refs/heads/main"

    served.server = start_server(
        "127.0.0.1:0",
        metrics=metrics,
        on_push=on_push,
        secret=SECRET,
        health=lambda: {"ok": True, "last_error": None},
        pages=_pages(served),
        max_body=4096,
        read_timeout=1.0,
        request_timeout=3.0,
        write_timeout=1.0,
    )
    yield served
    served.server.shutdown()


def exchange(addr: tuple[str, int], raw: bytes, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read until the server closes; return (status, headers, body)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(raw)
        data = _read_all(s)
    return parse_response(data)


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def post(headers: Mapping[str, str], body: bytes = BODY, path: str = "/hooks/git") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def test_signed_webhook_accepted_case_insensitively(served: Served) -> None:
    for name in ("X-Hub-Signature-256", "x-hub-signature-256", "X-HUB-SIGNATURE-256"):
        status, _, body = exchange(served.addr, post({name: GOOD, "Content-Length": str(len(BODY))}))
        assert status == 202, body
        assert json.loads(body)["accepted"] is True
    gitea = GOOD.removeprefix("sha256=")
    assert exchange(served.addr, post({"x-gitea-signature": gitea, "content-length": str(len(BODY))}))[0] == 202
    assert exchange(served.addr, post({"X-Gogs-Signature": gitea, "Content-Length": str(len(BODY))}))[0] == 202
    assert exchange(served.addr, post({"x-gitlab-token": SECRET, "Content-Length": str(len(BODY))}))[0] == 202
    assert served.pushes == ["refs/heads/main"] * 6


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Content-Length": "26"}, 401),  # no signature header at all
        ({"X-Hub-Signature-256": "sha256=" + "0" * 64, "Content-Length": "26"}, 401),  # wrong signature
        ({"X-Hub-Signature-256": "sha256=abc", "Content-Length": "26"}, 401),  # wrong length
        ({"X-Hub-Signature-256": "sha256=" + "z" * 64, "Content-Length": "26"}, 401),  # not hex
        ({"X-Hub-Signature-256": "md5=" + "0" * 64, "Content-Length": "26"}, 401),
        ({"X-Gitea-Signature": "é" * 64, "Content-Length": "26"}, 401),  # non-ASCII
        ({"X-Gitlab-Token": "tökén", "Content-Length": "26"}, 401),  # non-ASCII token
        ({"X-Gitlab-Token": "x" * 2000, "Content-Length": "26"}, 401),
        ({"X-Gitlab-Token": "wrong-token", "Content-Length": "26"}, 401),
        ({"X-Hub-Signature-256": GOOD}, 411),  # no Content-Length
        ({"X-Hub-Signature-256": GOOD, "Transfer-Encoding": "chunked"}, 411),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "-1"}, 400),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "+26"}, 400),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "26, 27"}, 400),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "abc"}, 400),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "99999999999999999999999"}, 400),
        ({"X-Hub-Signature-256": GOOD, "Content-Length": "4097"}, 413),  # over max_body (4096 here)
        ({"X-Hub-Signature-256": GOOD, "Content-Length": str(10**12)}, 413),
    ],
)
def test_webhook_refusals(served: Served, headers: dict[str, str], expected: int) -> None:
    status, _, body = exchange(served.addr, post(headers))
    assert status == expected, body
    assert json.loads(body)["error"]
    assert "Traceback" not in body.decode()
    assert served.pushes == []


def test_refusal_comes_before_the_body_is_sent(served: Served) -> None:
    """A 413/401 answers right after the headers: the client never has to send its body."""
    for headers, expected in (
        ({"X-Hub-Signature-256": GOOD, "Content-Length": str(300 * 1024 * 1024)}, 413),
        ({"Content-Length": "100000"}, 401),
    ):
        with socket.create_connection(served.addr, timeout=5) as s:
            started = time.monotonic()
            s.sendall(post(headers, body=b""))
            status, _, _ = parse_response(_read_all(s))
        assert status == expected
        assert time.monotonic() - started < 1.0


def test_expect_100_continue(served: Served) -> None:
    with socket.create_connection(served.addr, timeout=5) as s:
        s.sendall(post({"X-Hub-Signature-256": GOOD, "Content-Length": str(len(BODY)), "Expect": "100-continue"}, b""))
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(BODY)
        assert parse_response(_read_all(s))[0] == 202


def test_body_sent_in_pieces_is_accepted(served: Served) -> None:
    with socket.create_connection(served.addr, timeout=5) as s:
        s.sendall(post({"X-Hub-Signature-256": GOOD, "Content-Length": str(len(BODY))}, b""))
        for i in range(0, len(BODY), 5):
            s.sendall(BODY[i : i + 5])
            time.sleep(0.02)
        assert parse_response(_read_all(s))[0] == 202


def test_short_body_and_slow_head_time_out(served: Served) -> None:
    # declares 1000 bytes, sends 10: 408 after read_timeout (1 s here)
    with socket.create_connection(served.addr, timeout=5) as s:
        s.sendall(post({"X-Hub-Signature-256": GOOD, "Content-Length": "1000"}, b"0123456789"))
        started = time.monotonic()
        status, _, _ = parse_response(_read_all(s))
        assert status == 408
        assert time.monotonic() - started < 2.5
    # slowloris: one header byte every 0.5 s never completes; request_timeout (3 s) ends it
    with socket.create_connection(served.addr, timeout=6) as s:
        started = time.monotonic()
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        closed = False
        while time.monotonic() - started < 6:
            try:
                s.sendall(b"X")
                time.sleep(0.5)
            except OSError:
                closed = True
                break
        assert closed, "the server kept a slowloris connection open past its request timeout"
        assert time.monotonic() - started < 5
    # idle: a connection that sends nothing is closed after read_timeout
    with socket.create_connection(served.addr, timeout=5) as s:
        started = time.monotonic()
        data = _read_all(s)
        assert time.monotonic() - started < 2.5
        assert data.startswith(b"HTTP/1.1 408")


def test_metrics_healthz_and_errors(served: Served) -> None:
    exchange(served.addr, post({"X-Gitlab-Token": "wrong-token", "Content-Length": "26"}))
    exchange(served.addr, post({"Content-Length": "26"}))
    served.metrics.tick_exception()
    served.metrics.set_objects({("model", "RUNNING"): 2})
    served.metrics.last_applied_commit_time = 1764417600
    status, headers, body = exchange(served.addr, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    assert 'argus_errors_total{kind="webhook_signature"} 2.0' in text
    assert "argus_tick_exceptions_total 1.0" in text
    assert 'argus_objects{kind="model",state="RUNNING"} 2.0' in text
    assert "argus_last_applied_commit_timestamp_seconds 1.7644176e+09" in text
    assert "process_resident_memory_bytes" in text  # process collector
    assert 'argus_http_rejected_total{reason="signature"} 1.0' in text
    status, _, body = exchange(served.addr, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert status == 200 and json.loads(body)["ok"] is True
    status, headers, body = exchange(served.addr, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_malformed_requests(served: Served) -> None:
    cases = [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET http://evil/ HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-A: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400),
        (b"DELETE /hooks/git HTTP/1.1\r\n\r\n", 405),
        (b"POST /elsewhere HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 405),  # the pages are read-only
        (b"GET /hooks/\xff\xfe HTTP/1.1\r\n\r\n", 404),
    ]
    for raw, expected in cases:
        status, _, body = exchange(served.addr, raw)
        assert status == expected, (raw[:60], body)
        assert b"Traceback" not in body


def test_pages_and_streaming(served: Served) -> None:
    status, headers, body = exchange(served.addr, b"GET /hello?who=a&who=b HTTP/1.1\r\n\r\n")
    assert (status, body, headers["x-extra"]) == (200, b"hello a,b", "1")
    assert exchange(served.addr, b"GET /nothing HTTP/1.1\r\n\r\n")[0] == 404
    status, _, body = exchange(served.addr, b"GET /boom HTTP/1.1\r\n\r\n")
    assert status == 500 and b"handler bug" not in body and b"Traceback" not in body
    status, headers, _ = exchange(served.addr, b"GET /evil-header HTTP/1.1\r\n\r\n")
    assert status == 200 and "set-cookie" not in headers and "x-bad" not in headers
    status, headers, body = exchange(served.addr, b"GET /stream?n=3 HTTP/1.1\r\n\r\n")
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert body == b"7\r\nline 0\n\r\n7\r\nline 1\n\r\n7\r\nline 2\n\r\n0\r\n\r\n"
    status, headers, body = exchange(served.addr, b"GET /stream?n=2 HTTP/1.0\r\n\r\n")
    assert status == 200 and "transfer-encoding" not in headers and body == b"line 0\nline 1\n"


def test_stream_stops_when_the_client_leaves(served: Served) -> None:
    s = socket.create_connection(served.addr, timeout=5)
    s.sendall(b"GET /stream?n=0 HTTP/1.1\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()
    assert served.stream_closed.wait(3), "the stream kept running after its client left"


def test_page_address_has_no_webhook() -> None:
    metrics = Metrics()
    server = start_server(
        "127.0.0.1:0", metrics=metrics, on_push=None, secret=SECRET, health=lambda: {"ok": False}, pages=None
    )
    try:
        status, _, _ = exchange(server.server_address, post({"X-Hub-Signature-256": GOOD, "Content-Length": "26"}))
        assert status == 404
        assert exchange(server.server_address, b"GET /healthz HTTP/1.1\r\n\r\n")[0] == 503
        assert exchange(server.server_address, b"GET /anything HTTP/1.1\r\n\r\n")[0] == 404
    finally:
        server.shutdown()


def test_webhook_without_secret_is_disabled() -> None:
    server = start_server("127.0.0.1:0", metrics=Metrics(), on_push=lambda r: True, secret=None, health=dict)
    try:
        assert exchange(server.server_address, post({"X-Hub-Signature-256": GOOD, "Content-Length": "26"}))[0] == 403
    finally:
        server.shutdown()


def test_idle_connections_do_not_lock_out_scrapes(served: Served) -> None:
    """More idle sockets than the connection cap: the oldest are evicted, /healthz still answers."""
    server = start_server(
        "127.0.0.1:0",
        metrics=Metrics(),
        on_push=None,
        secret=None,
        health=lambda: {"ok": True},
        max_connections=32,
        read_timeout=30.0,
        request_timeout=60.0,
    )
    idle = [socket.create_connection(server.server_address, timeout=5) for _ in range(100)]
    try:
        time.sleep(0.3)
        assert len(server.conns) <= 32
        started = time.monotonic()
        assert exchange(server.server_address, b"GET /healthz HTTP/1.1\r\n\r\n")[0] == 200
        assert time.monotonic() - started < 1.0
        assert threading.active_count() < 60
    finally:
        for s in idle:
            s.close()
        server.shutdown()


def test_cli_default_body_limit_matches_the_server() -> None:
    from reconciler import cli
    from reconciler.server.core import DEFAULT_MAX_BODY

    assert cli.DEFAULT_MAX_BODY == DEFAULT_MAX_BODY
    assert cli.build_parser().parse_args(["run", "--repo", "."]).webhook_max_bytes == DEFAULT_MAX_BODY


def test_a_client_that_never_reads_frees_its_worker() -> None:
    """Writes time out: a page client that stops reading holds its (only) worker for write_timeout, not forever."""
    finished = threading.Event()

    def big() -> Iterator[bytes]:
        try:
            for _ in range(256):
                yield b"x" * (1024 * 1024)
        finally:
            finished.set()

    def handler(method: str, path: str, query: Mapping[str, list[str]]) -> Response | None:
        return Response(200, "text/plain", big() if path == "/big" else b"small")

    server = start_server(
        "127.0.0.1:0",
        metrics=Metrics(),
        on_push=None,
        secret=None,
        health=dict,
        pages=handler,
        page_threads=1,
        write_timeout=1.0,
    )
    try:
        stuck = socket.create_connection(server.server_address, timeout=5)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"GET /big HTTP/1.1\r\n\r\n")  # and never read
        assert finished.wait(5), "the worker is still writing to a client that does not read"
        assert exchange(server.server_address, b"GET /small HTTP/1.1\r\n\r\n")[2] == b"small"
        stuck.close()
    finally:
        server.shutdown()
