"""A flood against the real daemon's HTTP server (``argus run`` in a subprocess) on loopback.

The daemon runs against a real git repository and a Ray dashboard address where nothing listens
(it backs off, and its HTTP server serves on). For about 20 seconds the test sends, bounded in
count: large bodies (under and far over the limit, ``Content-Length: -1``, bodies declared and never
sent), slowloris clients, 300 idle sockets and malformed headers; meanwhile a signed webhook must be
accepted (202) and ``/healthz`` and ``/metrics`` must answer within two seconds every time. The
daemon's peak RSS (VmHWM) must stay under 200 MB and its thread count must not grow with the flood.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.testing.deps import require
from reconciler.testing.ray_head import free_port
from tests.support import ArgusRun, ConfigRepo, cluster_yaml

pytestmark = pytest.mark.e2e

SECRET = "flood-webhook-secret"
BODY = json.dumps({"ref": "refs/heads/main"}).encode()
GOOD = "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
FLOOD_SECONDS = 20.0
MB = 1024 * 1024


@dataclass
class Daemon:
    run: ArgusRun
    addr: tuple[str, int]

    def proc_status(self) -> dict[str, str]:
        text = Path(f"/proc/{self.run.pid}/status").read_text()
        return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}

    def rss_peak_mb(self) -> float:
        return int(self.proc_status()["VmHWM"].split()[0]) / 1024

    def threads(self) -> int:
        return int(self.proc_status()["Threads"])


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from _run_daemon(tmp_path)


def _run_daemon(tmp_path: Path, *extra: str) -> Iterator[Daemon]:
    require("prometheus_client", "watchfiles", "jinja2")
    (tmp_path / "users" / "carol").mkdir(parents=True)
    (tmp_path / "hf").mkdir()
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(tmp_path / "hf", tmp_path / "users", free_port()))
    repo.commit_push("cluster")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    env["ARGUS_WEBHOOK_SECRET"] = SECRET
    # Nobody listens on the Ray address: the daemon backs off, the server serves.
    args = ["--repo", str(repo.bare), "--ray", f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{port}"]
    run = ArgusRun([*args, *extra], tmp_path / "daemon.log", env).start()
    try:
        run.wait_serving(f"http://127.0.0.1:{port}/metrics")
        yield Daemon(run, ("127.0.0.1", port))
    finally:
        run.stop(grace=20)


def test_pages_on_their_own_address(tmp_path: Path) -> None:
    """``--web-listen``: pages, API, /metrics and /healthz there and no webhook; the webhook address serves no pages."""
    web_port = free_port()
    for d in _run_daemon(tmp_path, "--web-listen", f"127.0.0.1:{web_port}"):
        web = ("127.0.0.1", web_port)
        hook = post_head({"X-Hub-Signature-256": GOOD, "Content-Length": str(len(BODY))}) + BODY
        assert request(d.addr, hook)[0] == 202
        assert request(web, hook)[0] == 405  # no webhook there: the read-only pages refuse a POST
        status, page = request(web, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and b"<html" in page
        assert request(d.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 404
        assert _answers(web, "/metrics") == 200 and _answers(web, "/healthz") == 503


def _answers(addr: tuple[str, int], path: str) -> int:
    try:
        return request(addr, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), timeout=2)[0]
    except OSError:
        return 0


def request(addr: tuple[str, int], raw: bytes, timeout: float = 5.0, body_chunks: int = 0) -> tuple[int, bytes]:
    """Send a request head (and ``body_chunks`` MiB of body); return (status, body). Status 0: reset/closed."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(raw)
        try:
            for _ in range(body_chunks):
                s.sendall(b"x" * MB)
        except OSError:
            pass  # the server refused and closed: what we came to see
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return 0, data
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def post_head(headers: dict[str, str]) -> bytes:
    lines = ["POST /hooks/git HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


@dataclass
class Flood:
    addr: tuple[str, int]
    deadline: float
    seen: dict[str, Counter[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)

    def record(self, kind: str, status: int) -> None:
        with self.lock:
            self.seen.setdefault(kind, Counter())[status] += 1

    def repeat(self, kind: str, count: int, send: Callable[[], int]) -> None:
        for _ in range(count):
            if time.monotonic() > self.deadline:
                return
            try:
                self.record(kind, send())
            except OSError as exc:  # the client's own timeout: a server that stops answering
                self.errors.append(f"{kind}: {exc!r}")


def _flood_threads(f: Flood) -> list[threading.Thread]:
    wrong = "sha256=" + "0" * 64
    a = f.addr
    jobs: list[tuple[str, int, Callable[[], int]]] = [
        # a full 1 MiB body (at the limit): read, then 401 (or 503 when the body budget is taken)
        (
            "1mb_body",
            15,
            lambda: request(a, post_head({"X-Hub-Signature-256": wrong, "Content-Length": str(MB)}), 10, 1)[0],
        ),
        # a 300 MB body: 413 after the headers, the rest never read
        (
            "300mb",
            15,
            lambda: request(a, post_head({"X-Hub-Signature-256": wrong, "Content-Length": str(300 * MB)}), 10, 8)[0],
        ),
        # Content-Length: -1 with 8 MiB sent anyway: 400
        (
            "negative",
            15,
            lambda: request(a, post_head({"X-Hub-Signature-256": wrong, "Content-Length": "-1"}), 10, 8)[0],
        ),
        # chunked: 411
        (
            "chunked",
            15,
            lambda: request(a, post_head({"X-Hub-Signature-256": wrong, "Transfer-Encoding": "chunked"}), 10, 4)[0],
        ),
        # declares 1 MiB, sends 10 bytes: 408 after the read timeout
        (
            "short",
            4,
            lambda: request(
                a, post_head({"X-Hub-Signature-256": wrong, "Content-Length": str(MB)}) + b"0123456789", 15
            )[0],
        ),
        # malformed signature headers: 401 before any body
        (
            "malformed",
            100,
            lambda: request(a, post_head({"X-Gitlab-Token": "t\u00f6k\u00e9n", "Content-Length": "10"}) + b"0" * 10)[0],
        ),
        (
            "malformed",
            100,
            lambda: request(a, post_head({"X-Hub-Signature-256": "sha256=zz", "Content-Length": "10"}) + b"0" * 10)[0],
        ),
        ("garbage", 100, lambda: request(a, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 50 + b"\r\n\r\n")[0]),
    ]
    threads = []
    for kind, count, send in jobs:
        for _ in range(2):
            threads.append(threading.Thread(target=f.repeat, args=(kind, count, send), daemon=True))
    return threads


def test_flood_leaves_webhook_health_and_metrics_answering(daemon: Daemon) -> None:
    baseline_threads = daemon.threads()
    f = Flood(daemon.addr, time.monotonic() + FLOOD_SECONDS)

    idle = [socket.create_connection(daemon.addr, timeout=30) for _ in range(300)]
    slow = [socket.create_connection(daemon.addr, timeout=30) for _ in range(50)]
    for s in slow:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
    slow_closed_after: list[float] = []
    slow_started = time.monotonic()

    def slowloris() -> None:
        alive = list(slow)
        while alive and time.monotonic() < f.deadline:
            for s in list(alive):
                try:
                    s.sendall(b"X-A: b\r\n"[:1])
                except OSError:
                    slow_closed_after.append(time.monotonic() - slow_started)
                    alive.remove(s)
            time.sleep(1.0)

    threads = [*_flood_threads(f), threading.Thread(target=slowloris, daemon=True)]
    for t in threads:
        t.start()

    latencies: dict[str, list[float]] = {"/healthz": [], "/metrics": [], "webhook": []}
    statuses: dict[str, Counter[int]] = {k: Counter() for k in latencies}
    peak_threads = baseline_threads
    while time.monotonic() < f.deadline:
        for name, raw in (
            ("/healthz", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("/metrics", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("webhook", post_head({"x-hub-signature-256": GOOD, "Content-Length": str(len(BODY))}) + BODY),
        ):
            started = time.monotonic()
            try:
                status = request(daemon.addr, raw, timeout=5)[0]
            except OSError:
                status = -1
            latencies[name].append(time.monotonic() - started)
            statuses[name][status] += 1
        peak_threads = max(peak_threads, daemon.threads())
        time.sleep(0.5)

    for t in threads:
        t.join(timeout=30)
    idle_closed = 0
    for s in idle:
        try:
            s.settimeout(0.5)
            data = s.recv(100)
            idle_closed += data == b"" or data.startswith(b"HTTP/1.1 408")
        except OSError:
            idle_closed += 1  # reset or evicted: closed by the server
        s.close()
    for s in slow:
        s.close()

    peak_mb = daemon.rss_peak_mb()
    report = {
        "peak_rss_mb": round(peak_mb, 1),
        "threads": [baseline_threads, peak_threads],
        "max_latency_s": {k: round(max(v), 3) for k, v in latencies.items()},
        "ops": {k: dict(v) for k, v in statuses.items()},
        "flood": {k: dict(v) for k, v in f.seen.items()},
        "slowloris_closed_after_s": round(max(slow_closed_after), 1) if slow_closed_after else None,
    }
    print(json.dumps(report))
    assert daemon.run.alive(), daemon.run.log()[-3000:]
    assert not f.errors, f.errors[:5]

    # operators and the git host were served throughout
    assert statuses["webhook"] and set(statuses["webhook"]) == {202}, report
    assert set(statuses["/metrics"]) == {200}, report
    assert set(statuses["/healthz"]) == {503}, report  # answers: not healthy, Ray is unreachable
    for name, values in latencies.items():
        assert max(values) < 2.0, (name, report)

    # each attack got its refusal (0 = reset while the client was still sending after the refusal)
    expected = {
        "1mb_body": {401, 503},
        "300mb": {413, 0},
        "negative": {400, 0},
        "chunked": {411, 0},
        "short": {408},
        "malformed": {401},
        "garbage": {400},
    }
    for kind, allowed in expected.items():
        seen = f.seen.get(kind, Counter())
        assert seen and set(seen) <= allowed, (kind, report)
    assert f.seen["300mb"][413] and f.seen["negative"][400] and f.seen["1mb_body"][401], report

    # slow and idle clients were cut off, not kept
    assert len(slow_closed_after) == len(slow) and max(slow_closed_after) < 19, (
        report
    )  # server closes at 15 s; the client notices on a later send
    assert idle_closed == len(idle), report

    # bounded: memory and threads
    assert peak_mb < 200, report
    assert peak_threads <= baseline_threads + 2, report
    metrics = request(daemon.addr, b"GET /metrics HTTP/1.1\r\n\r\n")[1].decode()
    assert 'argus_http_rejected_total{reason="too_large"}' in metrics
    assert 'argus_http_rejected_total{reason="timeout"}' in metrics
