"""The model prober's decisions (a poster stand-in answers; the real endpoint is in
tests/e2e/test_engine_health.py) and how assess turns its verdicts into states."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from reconciler.builders.serve import app_name
from reconciler.observe.probe import ModelProber, probe_request
from reconciler.plan.actions import Plan
from reconciler.plan.actual import ActualModel, ActualState, Capacity
from reconciler.plan.assess import assess
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

KEY = ObjectKey("alice", "model", "chat")
APP = app_name("alice", "chat")
DEAD = json.dumps(
    {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause."}}
)


class Endpoint:
    """Answers each POST with the next scripted (status, body), or raises TimeoutError."""

    def __init__(self, *answers: tuple[int, str] | None) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, Mapping[str, Any]]] = []

    def __call__(self, url: str, body: Mapping[str, Any], timeout: float) -> tuple[int, str]:
        self.calls.append((url, body))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is None:
            raise TimeoutError("timed out")
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def model(status: str = "RUNNING") -> ActualModel:
    return ActualModel(KEY, "alice-202612010000-chat", "h", 1, ready_replicas=1, status=status)


def check(prober: ModelProber, replicas: tuple[str, ...] = ("r1",), status: str = "RUNNING") -> ActualModel:
    return prober.check({KEY: model(status)}, {APP: {}}, {APP: replicas})[KEY]


def state_of(m: ActualModel) -> tuple[str, str]:
    s = assess(DesiredState(cluster=ClusterSpec()), ActualState(models={KEY: m}, capacity=Capacity()), Plan([]))[KEY]
    return s.state, s.reason


def test_an_answer_is_running_and_is_reused_while_fresh() -> None:
    ep, clock = Endpoint((200, "{}")), Clock()
    prober = ModelProber("http://serve:8000/", post=ep, clock=clock, fresh_for=4.0)  # as set here, not the default
    assert state_of(check(prober))[0] == "RUNNING"
    assert ep.calls[0][0] == "http://serve:8000/v1/completions"
    assert ep.calls[0][1]["max_tokens"] == 1
    clock.now += 3.0
    check(prober)
    assert len(ep.calls) == 1  # fresh: a burst of push ticks asks nothing
    clock.now += 2.0
    check(prober)
    assert len(ep.calls) == 2


def test_a_dead_engine_is_failed_with_its_error_and_asked_again_every_tick() -> None:
    ep = Endpoint((200, "{}"), (500, DEAD))
    clock = Clock()
    prober = ModelProber("http://serve:8000", post=ep, clock=clock)
    check(prober)
    clock.now += 10
    state, reason = state_of(check(prober))
    assert state == "FAILED"
    assert "HTTP 500" in reason and "EngineCore encountered an issue" in reason
    check(prober)
    assert len(ep.calls) == 3  # a failure is never reused


def test_new_replicas_need_a_new_answer() -> None:
    ep = Endpoint((200, "{}"), (404, '{"error": "model not found"}'))
    prober = ModelProber("http://serve:8000", post=ep, clock=Clock())
    check(prober, ("r1",))
    state, reason = state_of(check(prober, ("r2",)))  # Serve replaced the replica
    assert state == "DEPLOYING" and "waiting for the first answer" in reason and "404" in reason


@pytest.mark.parametrize("busy", [None, (503, "Back pressure"), (429, "")])
def test_no_answer_in_time_or_back_pressure_keeps_the_last_verdict(busy: tuple[int, str] | None) -> None:
    clock = Clock()
    ep = Endpoint((200, "{}"), busy)
    prober = ModelProber("http://serve:8000", post=ep, clock=clock)
    check(prober)
    clock.now += 10
    assert state_of(check(prober))[0] == "RUNNING"  # a busy model is not a dead one
    fresh = ModelProber("http://serve:8000", post=Endpoint(busy), clock=clock)
    assert state_of(check(fresh))[0] == "DEPLOYING"  # but it has not answered yet either


def test_only_running_models_are_asked_and_the_memo_follows_the_apps() -> None:
    ep = Endpoint((200, "{}"))
    prober = ModelProber("http://serve:8000", post=ep, clock=Clock())
    assert check(prober, status="DEPLOYING") == model("DEPLOYING")
    assert ep.calls == []
    check(prober)
    assert prober._verdicts
    prober.check({}, {}, {})
    assert prober._verdicts == {}  # gone with its application


def test_a_poster_that_raises_gives_no_verdict_and_never_raises() -> None:
    calls = []

    def flaky(url: str, body: Mapping[str, Any], timeout: float) -> tuple[int, str]:
        calls.append(url)
        if len(calls) > 1:
            raise ValueError("boom")
        return 200, "{}"

    clock = Clock()
    prober = ModelProber("http://serve:8000", post=flaky, clock=clock)
    check(prober)
    clock.now += 10
    assert state_of(check(prober))[0] == "RUNNING"  # argus failing to ask says nothing about the model


def test_error_answers_are_bounded_and_redacted() -> None:
    body = json.dumps({"error": {"message": "token hf_" + "a" * 30 + " " + "x" * 5000}})
    prober = ModelProber("http://serve:8000", post=Endpoint((500, body)), clock=Clock())
    m = check(prober)
    assert "hf_aaaa" not in m.answer_error and len(m.answer_error) <= 600


def test_embedding_models_are_asked_for_an_embedding() -> None:
    pooling = {"args": {"llm_config": {"engine_kwargs": {"runner": "pooling"}}}}
    assert probe_request("m", pooling) == ("/v1/embeddings", {"model": "m", "input": "ping"})
    assert probe_request("m", {"args": "odd"})[0] == "/v1/completions"


def test_models_that_never_answer_cost_a_tick_at_most_the_wait() -> None:
    """A hostile user's many wedged models cannot hold every other user's tick for their timeouts."""
    release = threading.Event()
    sent: list[str] = []

    def wedged(url: str, body: Mapping[str, Any], timeout: float) -> tuple[int, str]:
        sent.append(str(body["model"]))
        release.wait(timeout)
        return 200, "{}"

    keys = [ObjectKey("mallory", "model", f"m{i}") for i in range(20)]
    models = {k: ActualModel(k, f"mallory-{k.name}", "h", 1, ready_replicas=1, status="RUNNING") for k in keys}
    replicas = {app_name(k.user, k.name): ("r",) for k in keys}
    prober = ModelProber("http://serve:8000", post=wedged, wait=0.3, timeout=30, workers=4)
    try:
        for _ in range(3):
            started = time.monotonic()
            out = prober.check(models, {}, replicas)
            assert time.monotonic() - started < 1.5
            assert all(m.awaiting_answer for m in out.values())
        assert len(sent) == 4  # what is out is not sent again; the rest waits for a free worker
        release.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            not m.awaiting_answer for m in prober.check(models, {}, replicas).values()
        ):
            time.sleep(0.05)
        assert all(not m.awaiting_answer for m in prober.check(models, {}, replicas).values())
    finally:
        release.set()
        prober.close()
