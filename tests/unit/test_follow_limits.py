"""Followers of live logs can never starve the pages: at most ``max_followers`` streams at once
(the next one gets 503), a quiet stream still notices a client that left (heartbeats), and the
slot of a gone client is freed."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from reconciler.logs.ray import RayLogs
from reconciler.server.core import HttpServer
from reconciler.server.metrics import Metrics
from reconciler.web.response import Response
from tests.unit.fake_ray import FakeRay

SID = "argus--bob--t--12345678"
DOC = {"submission_id": SID, "runs": [{"submission_id": SID}]}


@pytest.fixture
def served() -> Iterator[tuple[int, RayLogs]]:
    ray = FakeRay()
    ray.jobs[SID] = {
        "submission_id": SID,
        "status": "PENDING",  # never ends, never prints: the stream stays quiet
        "metadata": {"managed-by": "argus", "argus-user": "bob", "argus-task": "t"},
    }
    logs = RayLogs(ray, lambda s: s, poll_s=0.05)  # type: ignore[arg-type]

    def pages(method: str, path: str, query: dict[str, list[str]]) -> Response:
        if path == "/follow":
            try:
                chunks = logs.follow_task_log("bob", "t", DOC, None)
            except Exception as exc:  # the web handler's 503 for an ArgusError
                return Response(503, "text/plain", str(exc).encode())
            return Response(200, "text/plain", (c.encode() for c in chunks))
        return Response(200, "text/plain", b"overview")

    srv = HttpServer(
        "127.0.0.1:0", metrics=Metrics(), health=lambda: {"ok": True}, on_push=None, secret=None, pages=pages
    )
    try:
        yield srv.server_address[1], logs
    finally:
        srv.shutdown()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _abandon(port: int, n: int) -> None:
    for _ in range(n):  # send the request, close at once
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /follow HTTP/1.1\r\nHost: x\r\n\r\n")
        s.close()


def test_abandoned_followers_do_not_starve_the_pages(served: tuple[int, RayLogs]) -> None:
    port, logs = served
    _abandon(port, 40)
    time.sleep(0.5)
    started = time.monotonic()
    assert _status(port, "/") == 200 and time.monotonic() - started < 2
    # The gone clients' slots come back: a new follower is served again.
    deadline = time.monotonic() + 5
    while logs._followers._value < logs.max_followers and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert logs._followers._value == logs.max_followers  # type: ignore[attr-defined]


def test_live_followers_beyond_the_bound_get_503(served: tuple[int, RayLogs]) -> None:
    port, logs = served
    held = []
    for _ in range(logs.max_followers):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /follow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 200")
        held.append(s)
    try:
        assert _status(port, "/follow") == 503
        assert _status(port, "/") == 200
    finally:
        for s in held:
            s.close()
