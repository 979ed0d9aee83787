"""The daemon's HTTP side: ``POST /hooks/git`` (push webhooks), ``/metrics`` and ``/healthz``. I/O."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Prometheus metrics, rendered in the text exposition format (no client library needed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets = [0] * len(BUCKETS)
        self.count = 0
        self.total = 0.0
        self.objects: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[str] = Counter()
        self.last_applied_commit_time = 0.0
        self.ticks = 0

    def tick(self, seconds: float) -> None:
        with self.lock:
            self.count += 1
            self.total += seconds
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self.buckets[i] += 1

    def set_objects(self, by_kind_state: Mapping[tuple[str, str], int]) -> None:
        with self.lock:
            self.objects = Counter(by_kind_state)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] += 1

    def render(self) -> str:
        with self.lock:
            out = [
                "# HELP argus_reconcile_duration_seconds Duration of one reconcile tick.",
                "# TYPE argus_reconcile_duration_seconds histogram",
            ]
            for bound, n in zip(BUCKETS, self.buckets, strict=True):
                out.append(f'argus_reconcile_duration_seconds_bucket{{le="{bound}"}} {n}')
            out.append(f'argus_reconcile_duration_seconds_bucket{{le="+Inf"}} {self.count}')
            out.append(f"argus_reconcile_duration_seconds_sum {self.total}")
            out.append(f"argus_reconcile_duration_seconds_count {self.count}")
            out += ["# HELP argus_objects Objects by kind and state.", "# TYPE argus_objects gauge"]
            for (kind, state), n in sorted(self.objects.items()):
                out.append(f'argus_objects{{kind="{kind}",state="{state}"}} {n}')
            out += [
                "# HELP argus_last_applied_commit_timestamp_seconds Commit time of the last applied revision.",
                "# TYPE argus_last_applied_commit_timestamp_seconds gauge",
                f"argus_last_applied_commit_timestamp_seconds {self.last_applied_commit_time}",
                "# HELP argus_errors_total Errors by kind.",
                "# TYPE argus_errors_total counter",
            ]
            for kind, n in sorted(self.errors.items()):
                out.append(f'argus_errors_total{{kind="{kind}"}} {n}')
            return "\n".join(out) + "\n"


def signature_ok(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    """Check a push webhook: GitHub/Gitea HMAC-SHA256 signatures or GitLab's token."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    hub = headers.get("X-Hub-Signature-256", "")
    if hub:
        return hmac.compare_digest(hub, "sha256=" + digest)
    gitea = headers.get("X-Gitea-Signature", "") or headers.get("X-Gogs-Signature", "")
    if gitea:
        return hmac.compare_digest(gitea, digest)
    token = headers.get("X-Gitlab-Token", "")
    if token:
        return hmac.compare_digest(token, secret)
    return False


def pushed_ref(body: bytes) -> str | None:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return None
    ref = data.get("ref") if isinstance(data, dict) else None
    return ref if isinstance(ref, str) else None


def start_server(
    listen: str,
    *,
    metrics: Metrics,
    on_push: Callable[[str | None], bool],
    secret: str | None,
    health: Callable[[], dict[str, Any]],
) -> ThreadingHTTPServer:
    """Serve on ``host:port`` in a daemon thread; return the server (``.shutdown()`` to stop).

    ``on_push(ref)`` returns whether the push concerns the tracked branch.
    """
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the daemon logs events itself
            return

        def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, metrics.render(), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                state = health()
                self._send(200 if state.get("ok") else 503, json.dumps(state))
            else:
                self._send(404, json.dumps({"error": "not found"}))

        def do_POST(self) -> None:
            if self.path != "/hooks/git":
                self._send(404, json.dumps({"error": "not found"}))
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 10 * 1024 * 1024))
            if not secret:
                self._send(403, json.dumps({"error": "webhook disabled: set ARGUS_WEBHOOK_SECRET"}))
                return
            if not signature_ok({k: v for k, v in self.headers.items()}, body, secret):
                metrics.error("webhook_signature")
                self._send(401, json.dumps({"error": "bad signature"}))
                return
            relevant = on_push(pushed_ref(body))
            self._send(202, json.dumps({"accepted": relevant, "time": time.time()}))

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="argus-http", daemon=True).start()
    return server
