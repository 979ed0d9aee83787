"""Rate limits and usage accounting in the router (reconciler/serve_apps/router.py with
reconciler/serve_apps/meter.py): who is limited, what counts, and ``GET /argus/usage``.

Drives ``ArgusIngress`` objects as tests/unit/test_router_auth.py does (its stand-in for Serve
and its table of keys, models and teams), with models whose streams report usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException

from reconciler.serve_apps import router
from reconciler.serve_apps.meter import ArgusMeter, RateLimitExceeded, rate_limited_response
from reconciler.serve_apps.router import ArgusIngress, InvalidApiKey
from tests.unit.test_meter import Handle
from tests.unit.test_router_auth import (
    ALICE_KEY,
    BOB_KEY,
    CARL_KEY,
    CHAT_ALIAS,
    CHAT_ID,
    TABLE,
    TEAM_ALIAS,
    FakeServe,
    call,
    request,
)
from tests.unit.test_router_refresh import settled

DAEMON_KEY = "the-daemons-key"
USAGE_CHUNK = 'data: {"id":"1","choices":[],"usage":{"prompt_tokens":60,"completion_tokens":50}}\n\n'
TEXT_CHUNK = 'data: {"id":"1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


class MeteredServe(FakeServe):
    """FakeServe whose models stream TEXT_CHUNK then USAGE_CHUNK (what vLLM sends with usage)."""

    def get_deployment_handle(self, deployment: str, app_name: str) -> Any:
        handle = super().get_deployment_handle(deployment, app_name)

        async def stream(*_: Any) -> Any:
            yield TEXT_CHUNK
            yield USAGE_CHUNK

        handle.options = lambda **_: type("H", (), {"chat": type("R", (), {"remote": staticmethod(stream)})})()
        return handle


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServe]:
    fake = MeteredServe()
    monkeypatch.setattr(router, "serve", fake)
    yield fake


def table(limits: dict[str, Any], keys: bool = True) -> dict[str, Any]:
    out = json.loads(json.dumps(TABLE))
    out["limits"] = limits
    if not keys:
        del out["keys"]
    return out


async def replica(config: dict[str, Any], meter: Handle | None = None) -> ArgusIngress:
    return await settled(ArgusIngress(meter), config)  # type: ignore[arg-type]


async def drain(answer: Any) -> list[Any]:
    assert not isinstance(answer, OpenAIHTTPException), answer
    return [item async for item in answer]


def refused(answer: Any) -> bool:
    return isinstance(answer, RateLimitExceeded) and answer.status_code == 429 and answer.retry_after >= 1


def test_a_user_over_her_requests_per_minute_is_refused_and_no_one_else(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica(table({"default": [2, None], "users": {"alice": [5, None]}}))
        assert not refused(call(r, CHAT_ALIAS, BOB_KEY)) and not refused(call(r, CHAT_ID, BOB_KEY))
        assert refused(call(r, CHAT_ALIAS, BOB_KEY))
        assert refused(call(r, CHAT_ALIAS, BOB_KEY))  # a refused request does not count: still 2
        assert r._meter.counters.pending["u:bob"] == [2, 0]
        for _ in range(5):  # alice's own limit overrides the default
            assert not refused(call(r, CHAT_ALIAS, ALICE_KEY))
        assert refused(call(r, CHAT_ALIAS, ALICE_KEY))
        for _ in range(20):  # the daemon's probes are never limited
            assert not refused(call(r, CHAT_ALIAS, DAEMON_KEY))

    asyncio.run(scenario())


def test_a_team_limit_sums_its_members(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica(table({"teams": {"research": [3, None]}}))
        for key in (ALICE_KEY, CARL_KEY, ALICE_KEY):
            assert not refused(call(r, TEAM_ALIAS, key))
        answer = call(r, TEAM_ALIAS, CARL_KEY)
        assert refused(answer) and "your team's requests per minute" in answer.message
        assert not refused(call(r, CHAT_ALIAS, BOB_KEY))  # not in the team, no default: unlimited

    asyncio.run(scenario())


def test_the_open_endpoint_is_never_limited(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica(table({"default": [1, 1]}, keys=False))
        for _ in range(5):
            await drain(call(r, CHAT_ALIAS, None))

    asyncio.run(scenario())


def test_tokens_count_from_the_responses_usage(serve: FakeServe) -> None:
    """A response's usage counts against the token limit once it arrives: the next request is over."""

    async def scenario() -> None:
        r = await replica(table({"default": [None, 100]}))
        items = await drain(call(r, CHAT_ALIAS, BOB_KEY))
        assert items == [TEXT_CHUNK, USAGE_CHUNK]  # the stand-in body is not a streamed request: kept
        assert r._meter.counters.pending["u:bob"] == [1, 110]
        answer = call(r, CHAT_ALIAS, BOB_KEY)
        assert refused(answer) and answer.retry_after > 1

    asyncio.run(scenario())


def test_usage_is_the_daemons_only_and_lists_who_used_which_app(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica(table({}), Handle(ArgusMeter()))
        await drain(call(r, CHAT_ALIAS, BOB_KEY))
        await drain(call(r, CHAT_ID, DAEMON_KEY))
        assert isinstance(call(r, "alice-nothing", BOB_KEY), OpenAIHTTPException)  # a 404: not usage
        for key in (BOB_KEY, None, "sk-wrong", ALICE_KEY):
            with pytest.raises(InvalidApiKey):
                await r.argus_usage(request(key))
        body = json.loads((await r.argus_usage(request(DAEMON_KEY))).body)
        rows = {(row["user"], row["app"]): row for row in body["rows"]}
        assert set(rows) == {("bob", "argus--bob--chat"), ("(daemon)", "argus--bob--chat")}
        assert rows["bob", "argus--bob--chat"]["requests"] == 1
        assert rows["bob", "argus--bob--chat"]["prompt_tokens"] == 60
        assert rows["bob", "argus--bob--chat"]["completion_tokens"] == 50
        assert len(body["epoch"]) == 32 and body["now"] > 0

        open_replica = await replica(table({}, keys=False), Handle(ArgusMeter()))
        await drain(call(open_replica, CHAT_ALIAS, None))
        await drain(call(open_replica, CHAT_ALIAS, DAEMON_KEY))
        with pytest.raises(InvalidApiKey):
            await open_replica.argus_usage(request(None))  # open endpoint: usage still the daemon's only
        body = json.loads((await open_replica.argus_usage(request(DAEMON_KEY))).body)
        assert {row["user"] for row in body["rows"]} == {"(open)", "(daemon)"}

    asyncio.run(scenario())


def test_over_http_a_stream_hides_the_usage_it_asked_for_and_a_429_carries_retry_after(serve: FakeServe) -> None:
    """Through Ray's FastAPI app with the handler build_router adds: a streamed chat request the
    router asked usage for on the client's behalf, then the 429 its tokens cause."""
    from fastapi.testclient import TestClient
    from ray.llm._internal.serve.core.ingress.ingress import init

    app = init()
    app.add_exception_handler(RateLimitExceeded, rate_limited_response)
    ingress = asyncio.run(replica(table({"default": [None, 100]}), Handle(ArgusMeter())))
    app.post("/v1/chat/completions")(ingress.chat)
    app.get("/argus/usage")(ingress.argus_usage)
    client = TestClient(app, raise_server_exceptions=False)
    bob = {"Authorization": f"Bearer {BOB_KEY}"}
    body = {"model": CHAT_ALIAS, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    answer = client.post("/v1/chat/completions", headers=bob, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.text == TEXT_CHUNK + "data: [DONE]\n\n"  # no usage chunk: bob did not ask for one
    asked = {**body, "stream_options": {"include_usage": True}}
    answer = client.post("/v1/chat/completions", headers=bob, json=asked)
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    error = answer.json()["error"]
    assert error["type"] == "RateLimitExceeded" and error["code"] == 429
    assert client.get("/argus/usage", headers=bob).status_code == 401
    usage = client.get("/argus/usage", headers={"Authorization": f"Bearer {DAEMON_KEY}"})
    assert usage.status_code == 200
    assert [(r["user"], r["requests"], r["prompt_tokens"]) for r in usage.json()["rows"]] == [("bob", 1, 60)]


def test_build_router_binds_one_meter_replica_into_the_router() -> None:
    app = router.build_router({"table": 3})
    assert app._bound_deployment.name == "ArgusRouter"
    args = app._bound_deployment.init_args
    assert len(args) == 1 and args[0]._bound_deployment.name == "ArgusMeter"
    assert args[0]._bound_deployment.num_replicas == 1
    assert args[0]._bound_deployment.ray_actor_options == {"num_cpus": 0}


def test_a_replica_waking_from_idle_asks_the_meter_before_deciding(serve: FakeServe) -> None:
    """Replica b synced long ago (idle replicas stop syncing); meanwhile replica a admitted bob's
    whole minute. b's next request for bob waits for one sync and is refused: the limit is the
    cluster's, not each replica's."""

    async def scenario() -> None:
        handle = Handle(ArgusMeter())
        a = await replica(table({"default": [2, None]}), handle)
        b = await replica(table({"default": [2, None]}), handle)
        for _ in range(2):
            await drain(call(a, CHAT_ALIAS, BOB_KEY))
        assert await a._meter.sync()
        before = handle.calls
        with pytest.raises(RateLimitExceeded) as over:
            await drain(call(b, CHAT_ALIAS, BOB_KEY))  # decided once the stream is read
        assert over.value.retry_after >= 1 and handle.calls > before
        assert not b._meter.stale(b._limits)  # fresh now: the next request is decided at once
        assert refused(call(b, CHAT_ALIAS, BOB_KEY))
        assert await drain(call(b, CHAT_ALIAS, ALICE_KEY))  # another user passes

    asyncio.run(scenario())
