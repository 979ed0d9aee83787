"""The daemon's usage recorder (reconciler/observe/usage.py): how often it reads the endpoint's
meter, what a failed read does (nothing but a log line and a count), GPU-seconds from the observed
jobs and models, the bounded label sets of the totals, and the Prometheus counters
(reconciler/server/metrics.py). The meter is a recorded function here; the real one is read in
tests/unit/test_endpoint_meter.py and through the real endpoint in tests/e2e/test_api_keys.py."""

from __future__ import annotations

import calendar
import json
from typing import Any

from reconciler.observe import usage as rec
from reconciler.observe.usage import UsageRecorder
from reconciler.plan.actual import ActualJob, ActualModel, ActualState
from reconciler.server.metrics import Metrics
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Team, UserPolicy

T = float(calendar.timegm((2026, 12, 5, 3, 0, 0)))
EPOCH = "c" * 32
CLUSTER = ClusterSpec(
    users={"alice": UserPolicy(), "bob": UserPolicy()}, teams={"vision": Team("vision", members=("alice",))}
)
DESIRED = DesiredState(CLUSTER, models={ObjectKey("alice", "model", "chat"): None})  # type: ignore[dict-item]


def meter(*rows: tuple[str, str, int, int, int]) -> dict[str, Any]:
    return {
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


class Router:
    """A recorded meter: answers ``answer`` (raises when ``fail``) and counts the reads."""

    def __init__(self, answer: Any = None, fail: bool = False) -> None:
        self.answer, self.fail = answer, fail
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.fail:
            raise OSError("the meter is gone")
        return self.answer


class Clock:
    def __init__(self) -> None:
        self.now = T

    def __call__(self) -> float:
        return self.now


def recorder(router: Router, clock: Clock, docs: dict[str, Any] | None = None) -> UsageRecorder:
    return UsageRecorder(router, lambda: docs or {}, clock=clock)


def test_reads_the_meter_at_most_every_interval() -> None:
    router, clock = Router(meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock()
    r = recorder(router, clock)
    docs = r.update(DESIRED, ActualState())
    assert router.calls == 1
    assert list(docs) == ["usage/2026-12-05.json"]
    clock.now += 30
    assert r.update(DESIRED, ActualState()) == {} and router.calls == 1  # not yet
    clock.now += 31
    assert r.update(DESIRED, ActualState()) == {} and router.calls == 2  # asked; nothing changed
    assert r.totals.requests == {("alice", "alice/models/chat"): 2}


def test_no_meter_and_failures_record_nothing_and_never_raise() -> None:
    errors: list[str] = []
    for answer, fail, failed in (
        (None, False, False),  # no meter (no endpoint in this process)
        ("not a document", False, False),  # merged as nothing (the ledger checks every row)
        ({"epoch": EPOCH, "rows": [{"hour": "x"}]}, False, False),
        (None, True, True),  # the read raised
    ):
        r = recorder(Router(answer, fail), Clock())
        r.on_error = errors.append
        assert r.update(DESIRED, ActualState()) == {}
        assert r.pull_errors == int(failed), answer
    no_reader = UsageRecorder(None, dict, clock=Clock())
    assert no_reader.update(DESIRED, ActualState()) == {} and no_reader.pull_errors == 0
    assert errors == ["usage_pull"]


def test_gpu_seconds_of_tasks_and_models() -> None:
    clock = Clock()
    r = recorder(Router(), clock)
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
    router, clock = Router(meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock()
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
    r = recorder(Router(body), Clock())
    r.update(DESIRED, ActualState())
    assert r.totals.requests == {
        ("alice", "alice/models/chat"): 1,
        ("(open)", "alice/models/chat"): 1,
        ("(other)", "alice/models/chat"): 1,
        ("alice", "(other)"): 1,
    }


def test_metrics_exposition() -> None:
    r = recorder(Router(meter(("alice", "argus--alice--chat", 2, 20, 10))), Clock())
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
    r = recorder(Router(), clock)
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
