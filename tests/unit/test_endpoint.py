"""argus's OpenAI endpoint (reconciler/endpoint): keys, access rules, limits, usage and what reaches
Serve, over real HTTP.

The endpoint runs on a local port and forwards to a recording stand-in for Ray Serve's proxy
(``Upstream``: it answers like Ray Serve LLM's ingress and keeps every request it receives, so a
test can say exactly what reached Ray). tests/e2e/test_api_keys.py sends the same requests through
a real Serve with the official OpenAI client, and tests/e2e/test_hostile_job.py with a job's shadow
apps listening.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from reconciler.builders.serve import gate_config, model_access, model_app_config, router_app_config
from reconciler.endpoint.gate import Caller, Gate, parse_gate
from reconciler.endpoint.meter import Meter
from reconciler.endpoint.server import MAX_BODY_BYTES, Endpoint
from reconciler.endpoint.service import start_site
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving, Team
from reconciler.testing.ray_head import free_port

ALICE_KEY, BOB_KEY, CARL_KEY = "sk-alice-0123456789", "sk-bob-0123456789", "sk-carl-0123456789"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS = {sha(ALICE_KEY): "alice", sha(BOB_KEY): "bob", sha(CARL_KEY): "carl"}
MODELS = {  # app -> (model id, alias)
    "argus--alice--secret": ("alice-202612010000-secret", "alice-secret"),
    "argus--alice--team": ("alice-202612010000-team", "alice-team"),
    "argus--bob--chat": ("bob-202612010000-chat", "bob-chat"),
}
ACCESS: dict[str, Any] = {"argus--alice--secret": [], "argus--alice--team": ["research"], "argus--bob--chat": None}
GATE: dict[str, Any] = {
    "models": [[app, f"LLMServer:{mid}", mid, ""] for app, (mid, _) in MODELS.items()],
    "keys": KEYS,
    "access": ACCESS,
    "teams": {"alice": "research", "carl": "research"},
}
SECRET_ID, SECRET_ALIAS = MODELS["argus--alice--secret"]
CHAT_ID, CHAT_ALIAS = MODELS["argus--bob--chat"]
TEAM_ID, TEAM_ALIAS = MODELS["argus--alice--team"]
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


@dataclass
class Upstream:
    """Records what reaches "Serve" and answers as Ray Serve LLM's ingress does."""

    seen: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    endpoint: Endpoint | None = None  # the endpoint in front of it (a test publishes new gates to it)
    usage: dict[str, int] = field(default_factory=lambda: dict(USAGE))  # what its answers claim
    pause: float = 0.0  # seconds between streamed chunks

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read()) if request.method == "POST" else None
        self.seen.append((request.path, dict(request.headers), body))
        if request.path == "/v1/models":
            cards = [{"id": i, "object": "model"} for pair in MODELS.values() for i in pair]
            return web.json_response({"object": "list", "data": cards})
        if request.path.startswith("/v1/models/"):
            return web.json_response({"id": request.path.rsplit("/", 1)[1], "object": "model"})
        if body and body.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for word in ("Par", "is"):
                chunk = {"choices": [{"index": 0, "delta": {"content": word}}], "model": body["model"]}
                await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(self.pause)
            if (body.get("stream_options") or {}).get("include_usage"):
                await out.write(f"data: {json.dumps({'choices': [], 'usage': self.usage})}\n\n".encode())
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            return out
        await asyncio.sleep(self.pause)
        return web.json_response({"choices": [{"text": "Paris"}], "model": body["model"], "usage": self.usage})


@asynccontextmanager
async def serving(
    config: Any, *, link: Any = "meter", publish: bool = True
) -> AsyncIterator[tuple[str, Upstream, Meter]]:
    """An endpoint with ``config`` published, in front of a recording upstream: ``(url, upstream, meter)``."""
    upstream = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", upstream.handle)
    up_runner = web.AppRunner(app)
    await up_runner.setup()
    up_port = free_port()
    await web.TCPSite(up_runner, "127.0.0.1", up_port).start()
    meter = Meter()
    endpoint = Endpoint(f"http://127.0.0.1:{up_port}", meter.link if link == "meter" else link)
    upstream.endpoint = endpoint
    if publish:
        endpoint.publish(config)
    port = free_port()
    runner = await start_site(endpoint, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", upstream, meter
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


async def call(
    url: str, path: str, key: str | None = None, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    """One request; returns ``(status, JSON body or text, headers)``."""
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession() as session:
        method = session.post if body is not None else session.get
        async with method(url + path, json=body, headers=sent) as resp:
            text = await resp.text()
            try:
                doc: Any = json.loads(text)
            except ValueError:
                doc = text
            return resp.status, doc, dict(resp.headers)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Capital of France?"}], **extra}


# -- keys and access ------------------------------------------------------------------------------


def test_before_the_daemons_first_gate_every_request_is_a_503() -> None:
    async def test() -> None:
        async with serving(GATE, publish=False) as (url, upstream, _):
            status, body, _ = await call(url, "/v1/chat/completions", ALICE_KEY, chat(CHAT_ALIAS))
            assert status == 503 and body["error"]["type"] == "ServiceUnavailable"
            assert upstream.seen == []

    run(test)


def test_no_key_or_a_wrong_one_is_a_401_on_every_route_and_reaches_nothing() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, _):
            for key in (None, "sk-nobody", ""):
                for path, body in (
                    ("/v1/models", None),
                    (f"/v1/models/{CHAT_ALIAS}", None),
                    ("/v1/chat/completions", chat(CHAT_ALIAS)),
                    ("/v1/completions", {"model": CHAT_ALIAS, "prompt": "x"}),
                    ("/v1/embeddings", {"model": CHAT_ALIAS, "input": "x"}),
                    ("/tokenize", {"model": CHAT_ALIAS, "prompt": "x"}),
                ):
                    status, doc, _ = await call(url, path, key, body)
                    assert status == 401 and doc["error"]["type"] == "InvalidApiKey", (key, path, doc)
            status, doc, _ = await call(
                url, "/v1/chat/completions", None, chat(CHAT_ALIAS), {"Authorization": "Basic x"}
            )
            assert status == 401
            assert upstream.seen == []

    run(test)


def test_a_private_model_is_a_404_for_others_exactly_as_one_that_does_not_exist() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, _):
            for name in (SECRET_ID, SECRET_ALIAS):
                refused = await call(url, "/v1/chat/completions", BOB_KEY, chat(name))
                missing = await call(url, "/v1/chat/completions", BOB_KEY, chat(name + "x"))
                assert refused[0] == missing[0] == 404
                assert refused[1]["error"]["message"].replace(name, "") == missing[1]["error"]["message"].replace(
                    name + "x", ""
                )
                assert (await call(url, f"/v1/models/{name}", BOB_KEY))[0] == 404
            assert upstream.seen == []  # refused without asking Serve
            _, listing, _ = await call(url, "/v1/models", BOB_KEY)
            ids = {c["id"] for c in listing["data"]}
            assert ids == {CHAT_ID, CHAT_ALIAS}  # bob's own model only: alice's are not even named
            assert (await call(url, "/v1/chat/completions", ALICE_KEY, chat(SECRET_ALIAS)))[0] == 200

    run(test)


def test_a_team_model_answers_its_team_and_a_public_model_everyone_with_a_key() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, _, _):
            assert (await call(url, "/v1/completions", CARL_KEY, {"model": TEAM_ALIAS, "prompt": "x"}))[0] == 200
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": TEAM_ALIAS, "prompt": "x"}))[0] == 404
            for key in (ALICE_KEY, CARL_KEY):
                assert (await call(url, "/v1/completions", key, {"model": CHAT_ALIAS, "prompt": "x"}))[0] == 200

    run(test)


def test_with_keys_a_request_names_its_model_and_without_keys_the_endpoint_is_open() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, _, _):
            status, doc, _ = await call(url, "/v1/completions", ALICE_KEY, {"prompt": "x"})
            assert status == 400 and "model" in doc["error"]["message"]
            assert (await call(url, "/v1/completions", ALICE_KEY, {"model": 7, "prompt": "x"}))[0] == 400
            assert (await call(url, "/v1/completions", ALICE_KEY, "[1, 2]"))[0] == 400
        open_gate = {"models": GATE["models"]}
        async with serving(open_gate) as (url, _, _):
            assert (await call(url, "/v1/completions", None, {"model": SECRET_ALIAS, "prompt": "x"}))[0] == 200
            _, listing, _ = await call(url, "/v1/models")
            assert len(listing["data"]) == 6

    run(test)


def test_what_reaches_serve_carries_no_credential_and_no_other_header() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, _):
            extra = {"Cookie": "session=alice", "X-Forwarded-For": "1.2.3.4", "X-Request-Id": "r-1", "X-Api-Key": "k"}
            assert (await call(url, "/v1/chat/completions", ALICE_KEY, chat(CHAT_ALIAS), extra))[0] == 200
            assert (await call(url, "/v1/models", ALICE_KEY, None, extra))[0] == 200
            for _path, headers, body in upstream.seen:
                names = {h.lower() for h in headers}
                assert not names & {"authorization", "cookie", "x-forwarded-for", "x-api-key"}, headers
                assert ALICE_KEY not in json.dumps(headers) + json.dumps(body)
            first = {k.lower(): v for k, v in upstream.seen[0][1].items()}
            assert first["x-request-id"] == "r-1" and first["content-type"] == "application/json"
            # Only what HTTP itself needs besides: nothing of the client's.
            assert set(first) <= {"host", "accept", "accept-encoding", "content-type", "content-length", "x-request-id"}

    run(test)


def test_keys_and_access_change_in_place_with_each_gate() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, _):
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0] == 200
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": SECRET_ALIAS, "prompt": "x"}))[0] == 404
            assert upstream.endpoint is not None
            upstream.endpoint.publish({**GATE, "keys": {sha(ALICE_KEY): "alice"}})  # bob's key revoked
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0] == 401
            upstream.endpoint.publish({**GATE, "access": {**ACCESS, "argus--alice--secret": ["bob"]}})
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": SECRET_ALIAS, "prompt": "x"}))[0] == 200

    run(test)


def test_the_gate_fails_closed() -> None:
    gate, problems = parse_gate({"models": [], "keys": {"not-a-hash": "eve", sha("k"): "ann"}})
    assert gate.keys == {sha("k"): "ann"} and len(problems) == 1
    gate, problems = parse_gate({"keys": ["x"]})
    assert gate.keys == {} and problems  # keys that cannot be read admit nobody
    gate, problems = parse_gate({"keys": {}, "access": {"argus--a--m": "bob", "argus--a--n": None}})
    assert "argus--a--m" not in gate.access and gate.access["argus--a--n"] is None and problems
    assert parse_gate({"models": []}) == (Gate(), [])  # no keys: open
    gate, problems = parse_gate(None)
    assert gate.open and gate.entries == {} and problems
    # A name two apps claim is visible only to who may call both.
    two = {
        "models": [["argus--alice--a", "d", "alice-1-a", "alice-x"], ["argus--alice--b", "d", "alice-1-b", "alice-x"]],
        "keys": KEYS,
        "access": {"argus--alice--a": None, "argus--alice--b": []},
    }
    gate, _ = parse_gate(two)
    assert not gate.visible(Caller("bob", None), "alice-x") and gate.visible(Caller("bob", None), "alice-1-a")


def test_413_for_a_huge_body_and_503_when_serve_does_not_answer() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, _):
            huge = {"model": CHAT_ALIAS, "prompt": "x" * (MAX_BODY_BYTES + 1)}
            assert (await call(url, "/v1/completions", ALICE_KEY, huge))[0] == 413
            assert upstream.seen == []
        endpoint = Endpoint(f"http://127.0.0.1:{free_port()}", None)  # nothing listens there
        endpoint.publish(GATE)
        port = free_port()
        runner = await start_site(endpoint, "127.0.0.1", port)
        try:
            status, doc, _ = await call(f"http://127.0.0.1:{port}", "/v1/completions", ALICE_KEY, chat(CHAT_ALIAS))
            assert status == 503 and doc["error"]["type"] == "ServiceUnavailable"
        finally:
            await runner.cleanup()

    run(test)


# -- limits and usage -------------------------------------------------------------------------------


LIMITED = {
    **GATE,
    "limits": {"default": [None, None], "users": {"alice": [2, None]}, "teams": {"research": [3, None]}},
}


def test_a_user_over_her_limit_gets_429_with_retry_after_and_no_one_else_does() -> None:
    async def test() -> None:
        async with serving(LIMITED) as (url, upstream, _):
            answers = [
                (await call(url, "/v1/completions", ALICE_KEY, {"model": CHAT_ALIAS, "prompt": "x"})) for _ in range(3)
            ]
            assert [a[0] for a in answers] == [200, 200, 429]
            _, doc, headers = answers[2]
            assert doc["error"]["type"] == "RateLimitExceeded" and doc["error"]["code"] == 429
            assert 1 <= int(headers["Retry-After"]) <= 120
            assert len(upstream.seen) == 2  # the refused request never reached Serve
            for _ in range(3):
                assert (await call(url, "/v1/completions", BOB_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0] == 200
            # carl is in alice's team: the team's 3 requests a minute are used up by alice's 2 and his 1.
            codes = [
                (await call(url, "/v1/completions", CARL_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0]
                for _ in range(2)
            ]
            assert codes == [200, 429]

    run(test)


def test_two_endpoint_processes_sharing_the_daemons_meter_hold_one_limit() -> None:
    async def test() -> None:
        meter = Meter()
        async with serving(LIMITED, link=meter.link) as (one, _, _), serving(LIMITED, link=meter.link) as (two, _, _):
            codes = []
            for url in (one, two, one, two):
                codes.append((await call(url, "/v1/completions", ALICE_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0])
                await asyncio.sleep(1.2)  # two sync periods: each process has the counts the other sent
            assert codes == [200, 200, 429, 429]
            rows = {(r["user"], r["app"]): r["requests"] for r in meter.usage()["rows"]}
            assert rows == {("alice", "argus--bob--chat"): 2}

    run(test)


def test_usage_counts_answers_and_streams_and_hides_the_usage_chunk_it_asked_for() -> None:
    async def test() -> None:
        async with serving(GATE) as (url, upstream, meter):
            assert (await call(url, "/v1/completions", ALICE_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0] == 200
            status, text, _ = await call(url, "/v1/chat/completions", BOB_KEY, chat(CHAT_ALIAS, stream=True))
            assert status == 200 and "Par" in text and '"usage"' not in text and text.endswith("data: [DONE]\n\n")
            assert upstream.seen[-1][2]["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
            asked = chat(CHAT_ALIAS, stream=True, stream_options={"include_usage": True})
            _, text, _ = await call(url, "/v1/chat/completions", BOB_KEY, asked)
            assert '"usage"' in text  # asked for: kept
            assert (await call(url, "/v1/completions", BOB_KEY, {"model": SECRET_ALIAS, "prompt": "x"}))[0] == 404
            await asyncio.sleep(0.7)  # the background sync
            rows = {
                (r["user"], r["app"]): (r["requests"], r["prompt_tokens"], r["completion_tokens"])
                for r in meter.usage()["rows"]
            }
            assert rows == {("alice", "argus--bob--chat"): (1, 5, 3), ("bob", "argus--bob--chat"): (2, 10, 6)}

    run(test)


def test_a_failing_meter_never_fails_requests_and_limits_stay_local() -> None:
    async def broken(_deltas: Any) -> dict[str, Any]:
        raise OSError("the daemon is restarting")

    async def test() -> None:
        async with serving(LIMITED, link=broken) as (url, _, _):
            codes = [
                (await call(url, "/v1/completions", ALICE_KEY, {"model": CHAT_ALIAS, "prompt": "x"}))[0]
                for _ in range(3)
            ]
            assert codes == [200, 200, 429]

    run(test)


# -- what the daemon builds ---------------------------------------------------------------------------


def spec(user: str, name: str, access: tuple[str, ...] | None = None) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey(user, "model", name),
        source="hf:org/model",
        source_path="/hf/model",
        source_task=None,
        replicas=1,
        gpus_per_replica=1,
        engine_kwargs={},
        env={},
        suspend=False,
        created_at=1764417600,
        access=access,
    )


CLUSTER = ClusterSpec(
    serving=Serving(accelerator="cpu", default_access=("research",)),
    teams={"research": Team(name="research", members=("alice", "carl"))},
)


def test_the_gate_carries_hashes_access_and_teams_and_the_router_only_the_table() -> None:
    secret, team, chat_ = spec("alice", "secret", ()), spec("alice", "team"), spec("bob", "chat", ("*",))
    apps = [model_app_config(m, CLUSTER, "/hf/model", "h") for m in (secret, team, chat_)]
    access = model_access([secret, team, chat_], CLUSTER)
    assert access == {"argus--alice--secret": [], "argus--alice--team": ["research"], "argus--bob--chat": None}
    config = gate_config(CLUSTER, apps, keys=KEYS, access=access)
    assert config["keys"] == KEYS and config["access"] == access
    assert config["teams"] == {"alice": "research", "carl": "research"}
    assert ALICE_KEY not in json.dumps(config)
    assert set(gate_config(CLUSTER, apps)) == {"models"}  # no keys file: open
    gate, problems = parse_gate(json.loads(json.dumps(config)))
    assert problems == [] and gate.keys == KEYS and gate.access["argus--alice--secret"] == frozenset()
    router = router_app_config(CLUSTER, apps)["deployments"][0]["user_config"]
    assert router == {"models": config["models"]}  # nothing in Ray decides for users


def test_a_carried_model_keeps_the_access_this_daemon_gave_it_else_its_owner_only() -> None:
    chat_, secret = spec("bob", "chat"), spec("alice", "secret")
    apps = [model_app_config(m, CLUSTER, "/hf/model", "h") for m in (chat_, secret)]
    before = gate_config(CLUSTER, apps, keys=KEYS, access={"argus--bob--chat": None})["access"]
    again = gate_config(CLUSTER, apps, keys=KEYS, access={}, before=before)
    assert again["access"] == {"argus--bob--chat": None, "argus--alice--secret": []}


@pytest.mark.parametrize("listen", ["auto", "127.0.0.1:8000", "[::1]:9", "0.0.0.0:65535"])
def test_listen_settings(listen: str) -> None:
    from reconciler.endpoint.hub import parse_listen

    host, port = parse_listen(listen, 8123)
    assert (host, port) == ("0.0.0.0", 8123) if listen == "auto" else port == int(listen.rsplit(":", 1)[1])


@pytest.mark.parametrize("listen", ["", "8000", "host:", "host:99999", "host:x"])
def test_bad_listen_settings(listen: str) -> None:
    from reconciler.endpoint.hub import parse_listen

    with pytest.raises(ValueError):
        parse_listen(listen, 8000)


def test_an_answers_usage_is_billed_only_within_the_requests_own_bounds() -> None:
    """A job's shadow app holding Serve's route for a few seconds could answer bob's requests with any
    usage: at most a token per request byte (plus a template's) and max_tokens are billed."""

    async def test() -> None:
        async with serving(GATE) as (url, upstream, meter):
            upstream.usage = {"prompt_tokens": 10**12, "completion_tokens": 10**12, "total_tokens": 2 * 10**12}
            body = {"model": CHAT_ALIAS, "prompt": "x", "max_tokens": 8}
            assert (await call(url, "/v1/completions", BOB_KEY, body))[0] == 200
            asked = chat(CHAT_ALIAS, stream=True, max_tokens=4)
            assert (await call(url, "/v1/chat/completions", BOB_KEY, asked))[0] == 200
            await asyncio.sleep(0.7)
            (row,) = meter.usage()["rows"]
            assert row["requests"] == 2 and row["completion_tokens"] == 8 + 4
            assert row["prompt_tokens"] <= 2 * (4096 + 200), row

    run(test)


def test_a_client_leaving_a_stream_is_no_serve_outage(caplog: pytest.LogCaptureFixture) -> None:
    """The openai client closes a stream as soon as it reads ``[DONE]``, often before the endpoint's last
    write: that is the client's business, never a "Serve did not answer" (nor a second answer)."""

    async def test() -> None:
        async with serving(GATE) as (url, upstream, meter):
            upstream.pause = 0.3
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": f"Bearer {BOB_KEY}"}
                async with session.post(
                    url + "/v1/chat/completions", json=chat(CHAT_ALIAS, stream=True), headers=headers
                ) as resp:
                    assert resp.status == 200
                    await resp.content.readline()
                    resp.close()  # leaves after the first chunk
            await asyncio.sleep(1.5)
            (row,) = meter.usage()["rows"]
            assert row["requests"] == 1 and row["completion_tokens"] >= 1  # charged for what it received

    with caplog.at_level("WARNING", logger="argus"):
        run(test)
    assert not [r for r in caplog.records if "did not answer" in r.getMessage()], caplog.text


def test_an_answer_the_client_left_before_is_not_billed() -> None:
    """A client that gives up (its timeout) never received the answer: it is not billed, and the next
    one is."""

    async def test() -> None:
        async with serving(GATE) as (url, upstream, meter):
            upstream.pause = 1.0
            body = {"model": CHAT_ALIAS, "prompt": "x", "max_tokens": 8}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
                with pytest.raises(TimeoutError):
                    await session.post(
                        url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {BOB_KEY}"}
                    )
            await asyncio.sleep(1.5)  # the answer came, with nobody to take it
            upstream.pause = 0.0
            assert (await call(url, "/v1/completions", BOB_KEY, body))[0] == 200
            await asyncio.sleep(0.7)
            (row,) = meter.usage()["rows"]
            assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (1, 5, 3)

    run(test)
