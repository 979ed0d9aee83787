"""The endpoint's meter (reconciler/endpoint/meter.py): the daemon's ``Meter`` and each endpoint
process's ``MeterClient`` against it, a meter that fails or hangs, the background sync, and a
process waking from idle. The 429 itself is answered in tests/unit/test_endpoint.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from reconciler.endpoint import meter as meter_module
from reconciler.endpoint.limits import Limits
from reconciler.endpoint.meter import Meter, MeterClient, RateLimitExceeded


class Handle:
    """The link to a Meter in process, counting its calls; ``fail``: each call raises, ``delay``: each
    call hangs that long first."""

    def __init__(self, target: Meter) -> None:
        self.target, self.calls, self.fail, self.delay = target, 0, False, 0.0

    async def __call__(self, deltas: Any) -> dict[str, Any]:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("meter gone")
        return self.target.sync(deltas)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    info = exception = warning


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    fake = Log()
    monkeypatch.setattr(meter_module, "log", fake)
    return fake


LIMITS = Limits((3, None))


def test_replicas_sharing_the_meter_enforce_one_limit() -> None:
    async def scenario() -> None:
        handle = Handle(Meter())
        a, b = MeterClient(handle), MeterClient(handle)
        assert a.admit(LIMITS, "alice", None) == ["u:alice"]
        assert a.admit(LIMITS, "alice", None) == ["u:alice"]
        assert await a.sync()
        assert await b.sync()
        b.admit(LIMITS, "alice", None)
        with pytest.raises(RateLimitExceeded) as refused:
            b.admit(LIMITS, "alice", None)
        assert refused.value.retry_after >= 1
        assert b.admit(LIMITS, "bob", None) == ["u:bob"]  # another user is not refused
        assert b.admit(None, "alice", None) == []  # no limits in the table: nothing counted

    asyncio.run(scenario())


def test_a_failing_meter_never_fails_requests_and_is_logged_once(log: Log) -> None:
    async def scenario() -> None:
        handle = Handle(Meter())
        handle.fail = True
        client = MeterClient(handle)
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
        assert log.lines[-1] == "argus endpoint: the meter answers again"
        rows = handle.target.usage()["rows"]
        assert [(r["user"], r["requests"], r["prompt_tokens"]) for r in rows] == [("alice", 1, 5)]  # once

    asyncio.run(scenario())


def test_a_hanging_meter_costs_a_sync_its_timeout_not_a_request(monkeypatch: pytest.MonkeyPatch, log: Log) -> None:
    monkeypatch.setattr(meter_module, "SYNC_TIMEOUT_S", 0.05)

    async def scenario() -> None:
        handle = Handle(Meter())
        handle.delay = 5.0
        client = MeterClient(handle)
        client.admit(LIMITS, "alice", None)
        started = time.monotonic()
        assert not await client.sync()
        assert time.monotonic() - started < 1.0
        assert client.counters.pending == {"u:alice": [1, 0]}

    asyncio.run(scenario())


def test_the_daemons_meter_answers_usage_rows_since_its_epoch() -> None:
    async def scenario() -> None:
        meter = Meter()
        client = MeterClient(meter.link)
        client.counters.record(time.time(), "alice", "argus--bob--chat", 1, 2, 3)
        assert await client.flush()
        answer = meter.usage()
        assert len(answer["epoch"]) == 32 and answer["rows"][0]["user"] == "alice"
        assert not await MeterClient(None).flush()  # no meter linked: counts stay local

    asyncio.run(scenario())


def test_a_process_waking_from_idle_asks_the_meter_before_deciding() -> None:
    """Process b synced long ago (idle processes stop syncing); meanwhile a admitted bob's whole
    minute. b's next request for bob waits for one sync and is refused: the limit is the
    cluster's, not each process's."""

    async def scenario() -> None:
        handle = Handle(Meter())
        a, b = MeterClient(handle), MeterClient(handle)
        limits = Limits((2, None))
        for _ in range(2):
            a.admit(limits, "bob", None)
        assert await a.sync()
        assert b.stale(limits)
        await b.freshen()
        assert not b.stale(limits)
        with pytest.raises(RateLimitExceeded):
            b.admit(limits, "bob", None)
        assert b.admit(limits, "alice", None) == ["u:alice"]

    asyncio.run(scenario())


def test_the_background_sync_runs_while_busy_and_stops_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meter_module, "SYNC_BUSY_S", 0.01)
    monkeypatch.setattr(meter_module, "BUSY_FOR_S", 0.1)

    async def scenario() -> None:
        handle = Handle(Meter())
        client = MeterClient(handle)
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


def test_stopping_the_background_sync_as_the_meter_answers_ends_it() -> None:
    """The background sync cancelled as the meter answers (an endpoint's shutdown, asyncio.run's
    end) stops: Python 3.11's ``asyncio.wait_for`` let the answer win and lost the cancellation, and
    the loop then waited for traffic forever, hanging whatever stopped it."""

    async def test() -> None:
        meter = Meter()
        for attempt in range(200):
            client = MeterClient(meter.link)
            client.admit(None, "bob", None)  # traffic: starts the background sync
            for _ in range(attempt % 7):
                await asyncio.sleep(0)
            stopped = asyncio.get_running_loop().create_task(client.close())
            done, _ = await asyncio.wait({stopped}, timeout=5)
            assert done, f"attempt {attempt}: the background sync did not stop"
            assert stopped.result() is True

    asyncio.run(test())
