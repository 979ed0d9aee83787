"""API keys and access rules in the router (reconciler/serve_apps/router.py) and in the table the
daemon pushes to it (reconciler/builders/serve.py).

Drives ``ArgusIngress`` objects (the class Serve wraps) against a stand-in for ``serve.status()``
with three running models: alice's private ``secret`` (``access: []``), her ``team`` model (her
team ``research``) and bob's public ``chat``. tests/e2e/test_api_keys.py sends the same requests
through a real Serve with the official OpenAI client.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException

from reconciler.apply.serve import RouterAuth, target_apps
from reconciler.builders.serve import ROUTER_APP, model_access, model_app_config, router_app_config
from reconciler.observe.serve import ServeObservation
from reconciler.serve_apps import router
from reconciler.serve_apps.router import ArgusIngress, Auth, Caller, InvalidApiKey, ModelNotFound, parse_auth
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving, Team
from tests.unit.test_router_refresh import settled

ALICE_KEY, BOB_KEY, CARL_KEY = "sk-alice-0123456789", "sk-bob-0123456789", "sk-carl-0123456789"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS = {sha(ALICE_KEY): "alice", sha(BOB_KEY): "bob", sha(CARL_KEY): "carl"}
# app -> (model id, alias)
MODELS = {
    "argus--alice--secret": ("alice-202612010000-secret", "alice-secret"),
    "argus--alice--team": ("alice-202612010000-team", "alice-team"),
    "argus--bob--chat": ("bob-202612010000-chat", "bob-chat"),
}
ACCESS: dict[str, Any] = {"argus--alice--secret": [], "argus--alice--team": ["research"], "argus--bob--chat": None}
TABLE: dict[str, Any] = {
    "models": [[app, f"LLMServer:{mid}", mid, ""] for app, (mid, _) in MODELS.items()],
    "keys": KEYS,
    "access": ACCESS,
    "teams": {"alice": "research", "carl": "research"},
    "daemon": hashlib.sha256(b"the-daemons-key").hexdigest(),
}
SECRET_ID, SECRET_ALIAS = MODELS["argus--alice--secret"]
CHAT_ID, CHAT_ALIAS = MODELS["argus--bob--chat"]
TEAM_ID, TEAM_ALIAS = MODELS["argus--alice--team"]


class FakeServe:
    """``serve.status()`` and ``get_deployment_handle()`` for the MODELS, all running."""

    def __init__(self) -> None:
        self.reads = 0

    def status(self) -> Any:
        self.reads += 1
        apps = {
            app: SimpleNamespace(
                deployments={f"LLMServer:{mid}": SimpleNamespace(replica_states={"RUNNING": 1})},
                last_deployed_time_s=1.0,
            )
            for app, (mid, _) in MODELS.items()
        }
        return SimpleNamespace(applications=apps)

    def get_deployment_handle(self, deployment: str, app_name: str) -> Any:
        config = SimpleNamespace(model_id=MODELS[app_name][0], input_modality="text", max_request_context_length=256)

        async def llm_config() -> Any:
            return config

        async def stream(*_: Any) -> Any:  # what a routed request would await: never reached here
            yield None

        handle = SimpleNamespace(llm_config=SimpleNamespace(remote=llm_config))
        handle.options = lambda **_: SimpleNamespace(chat=SimpleNamespace(remote=stream))
        return handle


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServe]:
    fake = FakeServe()
    monkeypatch.setattr(router, "serve", fake)
    yield fake


async def replica(table: Any = TABLE) -> ArgusIngress:
    return await settled(ArgusIngress(), table)


def request(key: str | None = None, scheme: str = "Bearer") -> Any:
    headers = {} if key is None else {"authorization": f"{scheme} {key}"}
    return SimpleNamespace(headers=headers)


def call(ingress: ArgusIngress, model: str | None, key: str | None) -> Any:
    """A chat completion's routing step: the stream it returns (not iterated), or the error raised."""
    return call_with(ingress, model, request(key))


def call_with(ingress: ArgusIngress, model: str | None, raw_request: Any) -> Any:
    body = SimpleNamespace(model=model, model_copy=lambda update: SimpleNamespace(model=update["model"]))
    try:
        return ingress._get_response(body=body, call_method="chat", raw_request=raw_request)
    except OpenAIHTTPException as exc:
        return exc


async def finish(answer: Any) -> Any:
    """The error a not-yet-routed name's stream raises when iterated, else ``answer``."""
    if isinstance(answer, OpenAIHTTPException) or not hasattr(answer, "__anext__"):
        return answer
    try:
        await answer.__anext__()
    except OpenAIHTTPException as exc:
        return exc
    finally:
        await answer.aclose()
    return answer


async def listed(ingress: ArgusIngress, key: str | None) -> set[str]:
    return {card.id for card in (await ingress.models(request(key))).data}


async def card(ingress: ArgusIngress, name: str, key: str | None) -> Any:
    try:
        return (await ingress.model_data(name, request(key))).id
    except OpenAIHTTPException as exc:
        return exc


def test_no_key_or_a_wrong_one_is_a_401_on_every_endpoint(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica()
        for headers in (request(), request("sk-wrong"), request(ALICE_KEY, "Basic"), request("")):
            for answer in (
                call_with(r, CHAT_ID, headers),
                await _araises(r.models(headers)),
                await _araises(r.model_data(CHAT_ID, headers)),
            ):
                assert isinstance(answer, InvalidApiKey) and answer.status_code == 401, (headers, answer)
        assert isinstance(_raises(lambda: r.caller(None)), InvalidApiKey)  # not HTTP: no key either
        assert r.caller(request(BOB_KEY, "bEaReR")) == Caller("bob", None)  # any case (RFC 7235)
        assert r.caller(request(CARL_KEY)) == Caller("carl", "research")

    asyncio.run(scenario())


def _raises(f: Any) -> Any:
    try:
        return f()
    except OpenAIHTTPException as exc:
        return exc


async def _araises(coro: Any) -> Any:
    try:
        return await coro
    except OpenAIHTTPException as exc:
        return exc


def test_a_private_model_is_a_404_for_others_exactly_as_a_model_that_does_not_exist(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica()
        reads = serve.reads
        for name in (SECRET_ID, SECRET_ALIAS):
            assert not isinstance(call(r, name, ALICE_KEY), OpenAIHTTPException)  # the owner always may
            refused, missing = call(r, name, BOB_KEY), call(r, "alice-nothing", BOB_KEY)
            assert isinstance(refused, ModelNotFound) and isinstance(missing, ModelNotFound)
            assert refused.status_code == missing.status_code == 404
            assert refused.message == missing.message.replace("alice-nothing", name)
            assert refused.type == missing.type
            refused_card, missing_card = await card(r, name, BOB_KEY), await card(r, "alice-nothing", BOB_KEY)
            assert isinstance(refused_card, ModelNotFound) and isinstance(missing_card, ModelNotFound)
            assert refused_card.message == missing_card.message.replace("alice-nothing", name)
            assert await card(r, name, ALICE_KEY) == name
        assert serve.reads == reads  # a refused name costs no Serve read, as an unknown one
        assert await listed(r, BOB_KEY) == {CHAT_ID, CHAT_ALIAS}
        assert await listed(r, ALICE_KEY) == {SECRET_ID, SECRET_ALIAS, TEAM_ID, TEAM_ALIAS, CHAT_ID, CHAT_ALIAS}

    asyncio.run(scenario())


def test_a_team_model_answers_its_team_and_a_public_model_everyone_with_a_key(serve: FakeServe) -> None:
    async def scenario() -> None:
        r = await replica()
        assert not isinstance(call(r, TEAM_ALIAS, CARL_KEY), OpenAIHTTPException)  # carl is in research
        assert isinstance(call(r, TEAM_ALIAS, BOB_KEY), ModelNotFound)
        assert isinstance(call(r, SECRET_ALIAS, CARL_KEY), ModelNotFound)  # alice's own: not her team's
        for key in (ALICE_KEY, BOB_KEY, CARL_KEY):
            assert not isinstance(call(r, CHAT_ALIAS, key), OpenAIHTTPException)
        assert await listed(r, CARL_KEY) == {TEAM_ID, TEAM_ALIAS, CHAT_ID, CHAT_ALIAS}

    asyncio.run(scenario())


def test_the_daemons_key_may_call_and_list_every_model(serve: FakeServe) -> None:
    """The daemon probes every model through the router (reconciler/observe/probe.py), private ones too."""

    async def scenario() -> None:
        r = await replica()
        assert r.caller(request("the-daemons-key")) == router.DAEMON
        assert not isinstance(call(r, SECRET_ALIAS, "the-daemons-key"), OpenAIHTTPException)
        assert SECRET_ID in await listed(r, "the-daemons-key")
        open_table = {k: v for k, v in TABLE.items() if k != "keys"}
        assert parse_auth(open_table)[0].daemon == TABLE["daemon"]  # kept: it authorizes /argus/usage
        assert (await replica(open_table)).caller(request("the-daemons-key")) is None  # open: nobody is named

    asyncio.run(scenario())


def test_a_request_without_a_model_names_none_when_keys_are_on(serve: FakeServe) -> None:
    """Ray's default picks the only model or lists every model in its error: with keys, a 400."""

    async def scenario() -> None:
        r = await replica()
        answer = call(r, None, BOB_KEY)
        assert isinstance(answer, OpenAIHTTPException) and answer.status_code == 400
        assert "alice" not in answer.message

    asyncio.run(scenario())


def test_a_tabled_model_not_running_yet_is_refused_without_a_read(serve: FakeServe) -> None:
    """A private model still starting: bob's request is a 404 at once (no read of Serve that
    would tell him, by its delay, that the name exists); alice's waits for a read."""

    async def scenario() -> None:
        table = json.loads(json.dumps(TABLE))
        table["models"].append(["argus--alice--new", "LLMServer:alice-2-new", "alice-2-new", ""])
        table["access"]["argus--alice--new"] = []
        r = await replica(table)
        reads = serve.reads
        assert isinstance(call(r, "alice-new", BOB_KEY), ModelNotFound)
        assert serve.reads == reads
        answer = await finish(call(r, "alice-new", ALICE_KEY))
        assert isinstance(answer, ModelNotFound)  # not running: after a read
        assert serve.reads == reads + 1

    asyncio.run(scenario())


def test_without_keys_the_endpoint_is_open_and_access_is_not_enforced(serve: FakeServe) -> None:
    async def scenario() -> None:
        table = {k: v for k, v in TABLE.items() if k != "keys"}
        r = await replica(table)
        assert r.caller(request()) is None
        assert not isinstance(call(r, SECRET_ALIAS, None), OpenAIHTTPException)
        assert SECRET_ALIAS in await listed(r, None)

    asyncio.run(scenario())


def test_keys_and_access_change_in_place(serve: FakeServe) -> None:
    """A new table revokes a key and opens a model at once (no restart, no read)."""

    async def scenario() -> None:
        r = await replica()
        table = json.loads(json.dumps(TABLE))
        del table["keys"][sha(BOB_KEY)]
        table["access"]["argus--alice--secret"] = ["carl"]
        await r.reconfigure(table)
        assert isinstance(call(r, CHAT_ALIAS, BOB_KEY), InvalidApiKey)
        assert not isinstance(call(r, SECRET_ALIAS, CARL_KEY), OpenAIHTTPException)

    asyncio.run(scenario())


def test_over_http_the_answers_are_openai_error_bodies(serve: FakeServe) -> None:
    """Through Ray's own FastAPI app (its error middleware) and real Starlette requests: a 401 and a
    refused model's 404 are ``{"error": {"message", "type", "code"}}`` bodies, as OpenAI's."""
    from fastapi.testclient import TestClient
    from ray.llm._internal.serve.core.ingress.ingress import init

    app = init()
    ingress = asyncio.run(replica())
    app.get("/v1/models")(ingress.models)
    app.get("/v1/models/{model:path}")(ingress.model_data)
    client = TestClient(app, raise_server_exceptions=False)
    bob = {"Authorization": f"Bearer {BOB_KEY}"}
    answer = client.get("/v1/models")
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "InvalidApiKey" and answer.json()["error"]["code"] == 401
    assert {"message", "type", "code"} <= answer.json()["error"].keys()
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-nope"}).status_code == 401
    answer = client.get("/v1/models", headers=bob)
    assert answer.status_code == 200 and {m["id"] for m in answer.json()["data"]} == {CHAT_ID, CHAT_ALIAS}
    refused, missing = client.get(f"/v1/models/{SECRET_ALIAS}", headers=bob), client.get("/v1/models/x", headers=bob)
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["error"]["type"] == missing.json()["error"]["type"] == "ModelNotFound"


def test_parse_auth_fails_closed() -> None:
    auth, problems = parse_auth({"models": [], "keys": {"not-a-hash": "eve", sha("k"): "ann"}})
    assert auth.keys == {sha("k"): "ann"} and len(problems) == 1
    auth, problems = parse_auth({"keys": ["x"]})
    assert auth.keys == {} and problems  # keys that cannot be read admit nobody
    auth, problems = parse_auth({"keys": {}, "access": {"argus--a--m": "bob", "argus--a--n": None}})
    assert "argus--a--m" not in auth.access and auth.access["argus--a--n"] is None and problems
    assert parse_auth({"models": []}) == (Auth(), [])  # no keys: open
    assert parse_auth(None) == (Auth(), [])


# -- what the daemon pushes ------------------------------------------------------------------------


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


def user_config(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = config["deployments"][0]["user_config"]
    return out


def test_the_router_config_carries_hashes_users_access_and_teams_only_with_keys() -> None:
    secret, team, chat = spec("alice", "secret", ()), spec("alice", "team"), spec("bob", "chat", ("*",))
    apps = [model_app_config(m, CLUSTER, "/hf/model", "h") for m in (secret, team, chat)]
    access = model_access([secret, team, chat], CLUSTER)
    assert access == {"argus--alice--secret": [], "argus--alice--team": ["research"], "argus--bob--chat": None}
    config = user_config(router_app_config(CLUSTER, apps, keys=KEYS, access=access))
    assert config["keys"] == KEYS and config["access"] == access
    assert config["teams"] == {"alice": "research", "carl": "research"}
    assert ALICE_KEY not in json.dumps(config)
    assert set(user_config(router_app_config(CLUSTER, apps))) == {"models"}  # no keys file: as before
    # The router reads what the builder wrote.
    auth, problems = parse_auth(json.loads(json.dumps(config)))
    assert problems == [] and auth.keys == KEYS and auth.access["argus--alice--secret"] == frozenset()


def test_a_carried_model_keeps_the_access_the_router_had_else_its_owner_only() -> None:
    """A model whose file is invalid now runs as it ran (carried): its access is not known from
    the file, so the router keeps what it was given; a model the router never had is its owner's."""
    chat, secret = spec("bob", "chat"), spec("alice", "secret")
    apps = [model_app_config(m, CLUSTER, "/hf/model", "h") for m in (chat, secret)]
    deployed = router_app_config(CLUSTER, apps, keys=KEYS, access={"argus--bob--chat": None})
    again = user_config(
        router_app_config(CLUSTER, apps, keys=KEYS, access={}, deployed=json.loads(json.dumps(deployed)))
    )
    assert again["access"] == {"argus--bob--chat": None, "argus--alice--secret": []}


def test_target_apps_puts_the_auth_in_the_router() -> None:
    chat = spec("bob", "chat")
    app = model_app_config(chat, CLUSTER, "/hf/model", "h")
    observation = ServeObservation()
    target = target_apps([app], observation, CLUSTER, RouterAuth(KEYS, model_access([chat], CLUSTER)))
    assert user_config(target[ROUTER_APP])["access"] == {"argus--bob--chat": ["research"]}
    assert "keys" not in user_config(target_apps([app], observation, CLUSTER)[ROUTER_APP])
