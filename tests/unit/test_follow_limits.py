"""Followers of live logs can never starve the pages: at most ``max_followers`` streams at once,
at most ``per_client`` from one client address and ``per_user`` of one user's runs (the next one
gets 503), a quiet stream still notices a client that left (heartbeats), and the slot of a gone
client is freed. Real sockets against the real server; Ray is a stand-in whose stream stays quiet."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from reconciler.dashboard import RayStream
from reconciler.logs.ray import RayLogs
from reconciler.logs.slots import Slots
from reconciler.server.core import HttpServer
from reconciler.server.metrics import Metrics
from reconciler.web.response import CLIENT_ADDRESS, Response
from tests.unit.fake_ray import FakeRay

SID = "argus--bob--t--12345678"
DOC = {"submission_id": SID, "runs": [{"submission_id": SID}]}


class Quiet:
    """A followed log that never prints: ``read1`` blocks until closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def read1(self, n: int) -> bytes:
        self.closed.wait(30)
        return b""

    def close(self) -> None:
        self.closed.set()

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class QuietRay(FakeRay):
    def stream(self, path: str, *, timeout: float | None = None) -> RayStream:
        return Quiet()  # type: ignore[return-value]


def _server(per_client: int, per_user: int = 10) -> tuple[HttpServer, RayLogs]:
    ray = QuietRay()
    ray.jobs[SID] = {
        "submission_id": SID,
        "status": "PENDING",  # never ends, never prints: the stream stays quiet
        "driver_node_id": "n1",
        "metadata": {"managed-by": "argus", "argus-user": "bob", "argus-task": "t"},
    }
    logs = RayLogs(ray, lambda s: s, poll_s=0.05, per_client=per_client, per_user=per_user)

    def pages(method: str, path: str, query: dict[str, list[str]]) -> Response:
        if path == "/follow":
            try:
                chunks = logs.follow_task_log("bob", "t", DOC, None, client=CLIENT_ADDRESS.get())
            except Exception as exc:  # the web handler's 503 for an ArgusError
                return Response(503, "text/plain", str(exc).encode())
            return Response(200, "text/plain", (c.encode() for c in chunks))
        return Response(200, "text/plain", b"overview")

    srv = HttpServer(
        "0.0.0.0:0", metrics=Metrics(), health=lambda: {"ok": True}, on_push=None, secret=None, pages=pages
    )
    return srv, logs


@pytest.fixture
def served() -> Iterator[tuple[int, RayLogs]]:
    srv, logs = _server(per_client=100)
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
    while logs.followers.free < logs.max_followers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logs.followers.free == logs.max_followers
    assert logs.followers.holders() == 0  # nothing is remembered of the clients that left


def test_live_followers_beyond_the_bound_get_503(served: tuple[int, RayLogs]) -> None:
    port, logs = served
    held = []
    for _ in range(logs.max_followers):
        held.append(_follow(port))
    try:
        assert _status(port, "/follow") == 503
        assert _status(port, "/") == 200
    finally:
        for s in held:
            s.close()


def _follow(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    s.sendall(b"GET /follow HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(64).startswith(b"HTTP/1.1 200")
    return s


def _answer(port: int, source: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), source_address=(source, 0), timeout=3) as s:
        s.sendall(b"GET /follow HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(4096)


def test_one_client_address_cannot_hold_every_follower_slot() -> None:
    srv, _logs = _server(per_client=2)
    port = srv.server_address[1]
    held = [_follow(port), _follow(port)]
    try:
        refused = _answer(port, "127.0.0.1")
        assert refused.startswith(b"HTTP/1.1 503") and b"from 127.0.0.1" in refused
        # Another address is still served while the first one holds its share.
        held.append(_follow(port, "127.0.0.2"))
        assert _status(port, "/") == 200
    finally:
        for s in held:
            s.close()
        srv.shutdown()


def test_one_users_runs_cannot_hold_every_follower_slot() -> None:
    srv, logs = _server(per_client=100, per_user=2)
    port = srv.server_address[1]
    held = [_follow(port, "127.0.0.3"), _follow(port, "127.0.0.4")]
    try:
        refused = _answer(port, "127.0.0.5")
        assert refused.startswith(b"HTTP/1.1 503") and b"of bob's objects" in refused
        assert logs.followers.free == logs.max_followers - 2  # two slots stay for other users
    finally:
        for s in held:
            s.close()
        srv.shutdown()


def test_slots_forget_who_held_them() -> None:
    slots = Slots(total=3, per_user=2, per_client=1)
    assert slots.refusal("ann", "10.0.0.1") is None
    assert "from 10.0.0.1" in (slots.refusal("bob", "10.0.0.1") or "")
    assert slots.refusal("ann", "10.0.0.2") is None
    assert "of ann's objects" in (slots.refusal("ann", "10.0.0.3") or "")
    assert slots.refusal("bob", "10.0.0.3") is None
    assert "at most 3" in (slots.refusal("carol", "10.0.0.4") or "")
    for user, client in (("ann", "10.0.0.1"), ("ann", "10.0.0.2"), ("bob", "10.0.0.3")):
        slots.release(user, client)
    assert slots.free == 3 and slots.holders() == 0
