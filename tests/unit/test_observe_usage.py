"""The daemon's usage recorder (reconciler/observe/usage.py): what it asks the router and how
often, what a failed or odd answer does (nothing but a log line and a count), GPU-seconds from
the observed jobs and models, the bounded label sets of the totals, and the Prometheus counters
(reconciler/server/metrics.py). The router is a recorded function; the HTTP GET is tested
against a real local HTTP server."""

from __future__ import annotations

import calendar
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reconciler.observe import usage as rec
from reconciler.observe.usage import UsageRecorder, get_usage
from reconciler.plan.actual import ActualJob, ActualModel, ActualState
from reconciler.server.metrics import Metrics
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Team, UserPolicy

T = float(calendar.timegm((2026, 12, 5, 3, 0, 0)))
EPOCH = "c" * 32
CLUSTER = ClusterSpec(
    users={"alice": UserPolicy(), "bob": UserPolicy()}, teams={"vision": Team("vision", members=("alice",))}
)
DESIRED = DesiredState(CLUSTER, models={ObjectKey("alice", "model", "chat"): None})  # type: ignore[dict-item]


def meter(*rows: tuple[str, str, int, int, int]) -> bytes:
    return json.dumps(
        {
            "epoch": EPOCH,
            "now": T,
            "rows": [
                {
                    "hour": "2026-12-05T03",
                    "user": u,
                    "app": a,
                    "requests": r,
                    "prompt_tokens": p,
                    "completion_tokens": c,
                }
                for u, a, r, p, c in rows
            ],
        }
    ).encode()


class Router:
    """A recorded router: answers ``(status, body)`` and remembers what it was asked."""

    def __init__(self, status: int = 200, body: bytes = b"") -> None:
        self.status, self.body = status, body
        self.calls: list[tuple[str, str]] = []

    def __call__(self, url: str, key: str, timeout: float, max_bytes: int) -> tuple[int, bytes]:
        self.calls.append((url, key))
        if self.status < 0:
            raise TimeoutError("slow")
        return self.status, self.body


class Clock:
    def __init__(self) -> None:
        self.now = T

    def __call__(self) -> float:
        return self.now


def recorder(router: Router, clock: Clock, docs: dict[str, Any] | None = None) -> UsageRecorder:
    return UsageRecorder(
        lambda _c: "http://router:8000/", "the-daemon-key", lambda: docs or {}, get=router, clock=clock
    )


def test_pulls_at_most_every_interval_with_the_daemon_key() -> None:
    router, clock = Router(200, meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock()
    r = recorder(router, clock)
    docs = r.update(DESIRED, ActualState())
    assert router.calls == [("http://router:8000/argus/usage", "the-daemon-key")]
    assert list(docs) == ["usage/2026-12-05.json"]
    clock.now += 30
    assert r.update(DESIRED, ActualState()) == {} and len(router.calls) == 1  # not yet
    clock.now += 31
    assert r.update(DESIRED, ActualState()) == {} and len(router.calls) == 2  # asked; nothing changed
    assert r.totals.requests == {("alice", "alice/models/chat"): 2}


def test_no_router_and_failures_record_nothing_and_never_raise() -> None:
    errors: list[str] = []
    for status, body, failed in (
        (0, b"", False),  # connection refused: no router (no models)
        (404, b"", False),
        (401, b"", True),
        (500, b"", True),
        (200, b"not json", True),
        (200, b"x" * (rec.MAX_ANSWER_BYTES + 1), True),
        (-1, b"", True),  # timed out
    ):
        r = recorder(Router(status, body), Clock())
        r.on_error = errors.append
        assert r.update(DESIRED, ActualState()) == {}
        assert r.pull_errors == int(failed), status
    assert errors == ["usage_pull"] * 5


def test_gpu_seconds_of_tasks_and_models() -> None:
    clock = Clock()
    r = recorder(Router(404), clock)
    job = ActualJob(
        "argus--alice--train--1",
        ObjectKey("alice", "task", "train"),
        "h",
        "RUNNING",
        resources={"GPU": 2.0, "CPU": 1.0},
        start_time=int((T - 600) * 1000),
    )
    model = ActualModel(
        ObjectKey("alice", "model", "chat"),
        "chat",
        "h",
        replicas=2,
        ready_replicas=2,
        resources_per_replica={"GPU": 1.0},
    )
    r.update(DESIRED, ActualState(models={model.key: model}, jobs=[job]))
    clock.now += 61
    r.update(DESIRED, ActualState(models={model.key: model}, jobs=[job]))
    assert r.totals.gpu_seconds == {
        ("alice", "vision", "task"): 2.0 * (600 + 61),
        ("alice", "vision", "model"): 2 * 1.0 * 61,
    }


def test_a_restart_continues_from_the_documents() -> None:
    router, clock = Router(200, meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock()
    first = recorder(router, clock)
    docs = first.update(DESIRED, ActualState())
    again = recorder(router, clock, json.loads(json.dumps(docs)))
    assert again.update(DESIRED, ActualState()) == {}  # the same cumulative rows: no new document
    assert again.totals.requests == {("alice", "alice/models/chat"): 2}


def test_totals_have_bounded_labels() -> None:
    body = meter(
        ("alice", "argus--alice--chat", 1, 1, 1),
        ("(open)", "argus--alice--chat", 1, 1, 1),
        ("mallory", "argus--alice--chat", 1, 1, 1),  # a user the repository does not know
        ("alice", "argus--alice--gone", 1, 1, 1),  # a model no longer in the repository
    )
    r = recorder(Router(200, body), Clock())
    r.update(DESIRED, ActualState())
    assert r.totals.requests == {
        ("alice", "alice/models/chat"): 1,
        ("(open)", "alice/models/chat"): 1,
        ("(other)", "alice/models/chat"): 1,
        ("alice", "(other)"): 1,
    }


def test_metrics_exposition() -> None:
    r = recorder(Router(200, meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock())
    r.update(DESIRED, ActualState())
    metrics = Metrics()
    text = metrics.render()
    assert "argus_usage_requests_total{" not in text  # no usage source yet: no series
    metrics.usage = lambda: r.totals
    text = metrics.render()
    assert 'argus_usage_requests_total{model="alice/models/chat",user="alice"} 2.0' in text
    assert 'argus_usage_tokens_total{kind="prompt",model="alice/models/chat",user="alice"} 20.0' in text
    assert 'argus_usage_tokens_total{kind="completion",model="alice/models/chat",user="alice"} 10.0' in text
    assert "# TYPE argus_usage_gpu_seconds_total counter" in text


def test_get_usage_against_a_real_server() -> None:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            code = 200 if self.path == "/argus/usage" else 404
            body = b'{"epoch": "' + EPOCH.encode() + b'", "rows": []}' + b" " * 100
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status, body = get_usage(base + "/argus/usage", "k1", 5.0, 1000)
        assert status == 200 and json.loads(body)["epoch"] == EPOCH and seen == ["Bearer k1"]
        status, body = get_usage(base + "/argus/usage", "k1", 5.0, 10)
        assert status == 200 and len(body) == 11  # read no further than the cap (+1 to tell)
        assert get_usage(base + "/nope", "k1", 5.0, 1000)[0] == 404
    finally:
        server.shutdown()
        server.server_close()
    assert get_usage(base + "/argus/usage", "k1", 2.0, 1000)[0] == 0  # nothing listens: no router


def test_gpu_totals_fold_unknown_teams_and_users() -> None:
    from reconciler.status.usage import Totals

    totals = Totals(
        gpu_seconds={("alice", "gone", "task"): 1.0, ("alice", "vision", "task"): 2.0, ("eve", "x", "model"): 3.0}
    )
    out = rec.bounded_totals(totals, {"alice"}, set(), {"vision"})
    assert out.gpu_seconds == {
        ("alice", "(other)", "task"): 1.0,
        ("alice", "vision", "task"): 2.0,
        ("(other)", "", "model"): 3.0,
    }


def test_model_samples_are_written_every_flush_interval() -> None:
    clock = Clock()
    r = recorder(Router(404), clock)
    model = ActualModel(
        ObjectKey("alice", "model", "chat"),
        "chat",
        "h",
        replicas=1,
        ready_replicas=1,
        resources_per_replica={"GPU": 1.0},
    )
    actual = ActualState(models={model.key: model})
    r.update(DESIRED, actual)
    written = []
    for _ in range(20):  # 20 minutes, a pull each minute
        clock.now += 60
        written.append(bool(r.update(DESIRED, actual)))
    assert written.count(True) == 2  # at 10 and 20 minutes (SAMPLE_FLUSH_S)
    assert r.totals.gpu_seconds == {("alice", "vision", "model"): 20 * 60.0}
