"""The router's meter (reconciler/serve_apps/meter.py): ``ArgusMeter`` and each router replica's
``MeterClient`` against it, a meter that fails or hangs, the background sync, and the 429 the
router answers (through a FastAPI app with Ray's error middleware)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException

from reconciler.serve_apps import meter as meter_module
from reconciler.serve_apps.limits import Limits
from reconciler.serve_apps.meter import ArgusMeter, MeterClient, RateLimitExceeded, rate_limited_response


class Handle:
    """A DeploymentHandle stand-in calling an ArgusMeter in process; ``fail``: each call raises,
    ``delay``: each call hangs that long first."""

    def __init__(self, target: ArgusMeter) -> None:
        self.target, self.calls, self.fail, self.delay = target, 0, False, 0.0
        self.sync = SimpleNamespace(remote=lambda deltas: self._call(self.target.sync, deltas))
        self.usage = SimpleNamespace(remote=lambda: self._call(self.target.usage))

    async def _call(self, method: Any, *args: Any) -> Any:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("meter gone")
        return await method(*args)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    info = exception = warning


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    fake = Log()
    monkeypatch.setattr(meter_module, "logger", fake)
    return fake


LIMITS = Limits((3, None))


def test_replicas_sharing_the_meter_enforce_one_limit() -> None:
    async def scenario() -> None:
        handle = Handle(ArgusMeter())
        a, b = MeterClient(handle), MeterClient(handle)  # type: ignore[arg-type]
        assert a.admit(LIMITS, "alice", None) == ["u:alice"]
        assert a.admit(LIMITS, "alice", None) == ["u:alice"]
        assert await a.sync()
        assert await b.sync()
        b.admit(LIMITS, "alice", None)
        with pytest.raises(RateLimitExceeded) as refused:
            b.admit(LIMITS, "alice", None)
        assert refused.value.status_code == 429 and refused.value.retry_after >= 1
        assert b.admit(LIMITS, "bob", None) == ["u:bob"]  # another user is not refused
        assert b.admit(None, "alice", None) == []  # no limits in the table: nothing counted

    asyncio.run(scenario())


def test_a_failing_meter_never_fails_requests_and_is_logged_once(log: Log) -> None:
    async def scenario() -> None:
        handle = Handle(ArgusMeter())
        handle.fail = True
        client = MeterClient(handle)  # type: ignore[arg-type]
        client.admit(LIMITS, "alice", None)
        client.counters.record(time.time(), "alice", "argus--bob--chat", 1, 5, 5)
        assert not await client.sync()
        assert not await client.sync()
        client.admit(LIMITS, "alice", None)  # decided with local counts
        assert client.counters.pending == {"u:alice": [2, 0]}
        client.admit(LIMITS, "alice", None)
        with pytest.raises(RateLimitExceeded):
            client.admit(LIMITS, "alice", None)
        assert len(log.lines) == 1 and "did not answer" in log.lines[0]
        handle.fail = False
        assert await client.sync()
        assert log.lines[-1] == "argus router: the meter answers again"
        rows = (await client.usage())["rows"]
        assert [(r["user"], r["requests"], r["prompt_tokens"]) for r in rows] == [("alice", 1, 5)]  # once

    asyncio.run(scenario())


def test_a_hanging_meter_costs_a_sync_its_timeout_not_a_request(monkeypatch: pytest.MonkeyPatch, log: Log) -> None:
    monkeypatch.setattr(meter_module, "SYNC_TIMEOUT_S", 0.05)

    async def scenario() -> None:
        handle = Handle(ArgusMeter())
        handle.delay = 5.0
        client = MeterClient(handle)  # type: ignore[arg-type]
        client.admit(LIMITS, "alice", None)
        started = time.monotonic()
        assert not await client.sync()
        assert time.monotonic() - started < 1.0
        assert client.counters.pending == {"u:alice": [1, 0]}
        with pytest.raises(OpenAIHTTPException) as unavailable:
            await client.usage()
        assert unavailable.value.status_code == 503

    asyncio.run(scenario())


def test_usage_flushes_this_replicas_counts_first() -> None:
    async def scenario() -> None:
        client = MeterClient(Handle(ArgusMeter()))  # type: ignore[arg-type]
        client.counters.record(time.time(), "(daemon)", "argus--bob--chat", 1, 2, 3)
        answer = await client.usage()
        assert len(answer["epoch"]) == 32 and answer["rows"][0]["user"] == "(daemon)"
        with pytest.raises(OpenAIHTTPException) as unavailable:
            await MeterClient(None).usage()  # no meter bound
        assert unavailable.value.status_code == 503

    asyncio.run(scenario())


def test_the_background_sync_runs_while_busy_and_stops_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meter_module, "SYNC_BUSY_S", 0.01)
    monkeypatch.setattr(meter_module, "BUSY_FOR_S", 0.1)

    async def scenario() -> None:
        handle = Handle(ArgusMeter())
        client = MeterClient(handle)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert handle.calls == 0  # never had traffic: never syncs
        client.admit(LIMITS, "alice", None)
        await asyncio.sleep(0.3)
        busy = handle.calls
        assert busy >= 3
        await asyncio.sleep(0.2)
        assert handle.calls <= busy + 1  # idle: stopped
        client.admit(LIMITS, "alice", None)  # traffic again wakes it
        await asyncio.sleep(0.05)
        assert handle.calls > busy + 1
        assert client._task is not None
        client._task.cancel()

    asyncio.run(scenario())


def test_a_429_carries_retry_after_and_an_openai_error_body() -> None:
    from fastapi.testclient import TestClient
    from ray.llm._internal.serve.core.ingress.ingress import init

    app = init()
    app.add_exception_handler(RateLimitExceeded, rate_limited_response)

    @app.get("/limited")
    async def limited() -> None:
        raise RateLimitExceeded(17, "Rate limit exceeded: retry in 17 s.")

    answer = TestClient(app, raise_server_exceptions=False).get("/limited")
    assert answer.status_code == 429 and answer.headers["retry-after"] == "17"
    error = answer.json()["error"]
    assert error["type"] == "RateLimitExceeded" and error["code"] == 429 and "retry in 17 s" in error["message"]
