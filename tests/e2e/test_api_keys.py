"""API keys per user and model access rules through the official OpenAI client, on argus's own
endpoint (in the daemon's process) in front of a real Serve.

One ``argus run`` serves the module, with the admin's keys file and the git server's self-service
file (``ARGUS_API_KEYS``). Alice deploys a tiny model with ``access: []`` (hers only). Through the
endpoint: no key or a wrong one is a 401 with an OpenAI-shaped error body; alice's key lists and
calls her model; bob's key gets 404 for it exactly as for a model that does not exist, and does not
see it in ``/v1/models`` (nor by ``/v1/models/<name>``). Alice then opens it (``access: ['*']``):
bob's calls answer 200 and no replica restarts. Last, the admin removes bob's line: his key is a
401. Then bob's key made by ``argus-shell``'s ``key new`` is a 200, mallory's (not a user of
cluster.yaml) a 401, and after ``key revoke`` bob's is a 401 again. Nothing of it is in Ray: the
router's config carries the model table only.

Then limits and usage: carol may make CAROL_RPM requests a minute. Past them she gets 429 with
``Retry-After`` while bob's requests, made at the same time, all answer; after ``Retry-After``
seconds she is admitted again. The usage documents the daemon writes on the status branch (read
with ``argus usage --json``) then hold, per user, exactly the requests and the usage fields of the
responses each client received.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import ROUTER_APP, app_name
from reconciler.dashboard import Dashboard
from reconciler.observe.serve import observe_serve
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, cluster_yaml, model_yaml, remove_apps, wait_for

pytestmark = pytest.mark.e2e

TINY = "argus-test/tiny-llama"
DEPLOY_TIMEOUT_S = 900.0  # a vLLM load on a loaded 2-core machine
QUESTION = [{"role": "user", "content": "Say hello"}]
ALICE_KEY, BOB_KEY = "sk-argus-e2e-alice-3f9c2a7d1b", "sk-argus-e2e-bob-8e41d0c6a2"
CAROL_KEY = "sk-argus-e2e-carol-51be07aa94"
CAROL_RPM = 4
MODEL = "users/alice/models/secret.yaml"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Env:
    repo: ConfigRepo
    head: RayHead
    dash: Dashboard
    keys: Path
    self_keys: Path  # the git server's self-service file, the second keys file
    cluster: dict[str, Any]
    daemon: DaemonProc

    def status(self, path: str = MODEL) -> dict[str, Any]:
        """The object's document on the status branch the daemon writes."""
        return read_documents(str(self.repo.bare), "argus/status").get(path) or {}

    def client(self, key: str) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.daemon.openai_url}/v1", api_key=key, max_retries=0)

    def raw(self, path: str, key: str | None) -> tuple[int, dict[str, Any]]:
        """GET ``path`` of the endpoint: ``(status, JSON body)``."""
        req = urllib.request.Request(f"{self.daemon.openai_url}{path}")
        if key is not None:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read())


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("keys")
    users = root / "users"
    for user in ("alice", "bob"):
        (users / user).mkdir(parents=True)
    keys = root / "api-keys"  # the admin's file, outside the repository
    keys.write_text(f"# user  sha256 of the key\nalice {sha(ALICE_KEY)}\nbob {sha(BOB_KEY)}\n")
    self_keys = root / "self-service-keys"  # as the git server writes it (absent for now: no keys)
    repo = ConfigRepo(root)
    cluster = cluster_yaml(hf_cache, users, ray_head.serve_port, users={"alice": {}, "bob": {}})
    repo.write("cluster.yaml", cluster)
    repo.commit_push("cluster")
    dash = Dashboard(ray_head.dashboard_url)
    daemon = DaemonProc(repo, ray_head, root)
    # The meter is read every 2 s: the usage test below waits for it.
    daemon.start(extra_env={"ARGUS_API_KEYS": f"{keys},{self_keys}", "ARGUS_USAGE_INTERVAL": "2"})
    try:
        yield Env(repo, ray_head, dash, keys, self_keys, cluster, daemon)
    finally:
        daemon.stop()
        remove_apps(dash, lambda name: name.startswith("argus--alice--"))


def listed(client: Any) -> set[str]:
    return {m.id for m in client.models.list().data}


def answer(client: Any, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    return str(reply.choices[0].message.content)


def test_keys_and_a_private_model(env: Env) -> None:
    import openai

    env.repo.write(MODEL, model_yaml(TINY, access=[]))
    env.repo.commit_push("alice: a private model")

    def running() -> dict[str, Any] | None:
        secret = env.status()
        # RUNNING needs one real answer through Serve: the daemon's probe, which carries no key.
        return secret if secret.get("state") == "RUNNING" and secret["replicas"]["ready"] == 1 else None

    secret = wait_for(running, "alice's private model RUNNING", timeout=DEPLOY_TIMEOUT_S, every=3)
    dated, alias = secret["served_name"], secret["alias"]
    alice, bob = env.client(ALICE_KEY), env.client(BOB_KEY)
    wait_for(lambda: {dated, alias} <= listed(alice), "the endpoint to list alice's model to her", timeout=60)
    router = observe_serve(env.dash).apps[ROUTER_APP]["deployments"][0]["user_config"]
    assert set(router) == {"models"}, router  # no key hash, no access rule, no limit in Ray

    # No key, or a wrong one: 401, with an OpenAI-shaped error body.
    for key in (None, "sk-wrong"):
        status, body = env.raw("/v1/models", key)
        assert status == 401, (key, status, body)
        assert isinstance(body.get("error"), dict) and {"message", "type", "code"} <= body["error"].keys(), body
    with pytest.raises(openai.AuthenticationError):
        env.client("sk-wrong").chat.completions.create(model=alias, messages=QUESTION, max_tokens=2)

    # Alice: her model answers.
    assert answer(alice, alias)
    assert alice.models.retrieve(alias).id == alias

    # Bob: 404 as for a model that does not exist, and not listed.
    names = listed(bob)
    assert dated not in names and alias not in names
    for name in (alias, dated, "alice-does-not-exist"):
        with pytest.raises(openai.NotFoundError) as refused:
            answer(bob, name)
        assert refused.value.status_code == 404
        status, body = env.raw(f"/v1/models/{name}", BOB_KEY)
        assert status == 404 and body["error"]["type"] == "ModelNotFound", body
    status, missing = env.raw("/v1/models/alice-does-not-exist", BOB_KEY)
    status, private = env.raw(f"/v1/models/{alias}", BOB_KEY)
    assert _shape(private, alias) == _shape(missing, "alice-does-not-exist")

    # Alice opens her model: bob's calls answer, in place (no replica restarts).
    before = observe_serve(env.dash).replica_ids.get(app_name("alice", "secret"))
    env.repo.write(MODEL, model_yaml(TINY, access=["*"]))
    env.repo.commit_push("alice: open the model to everyone with a key")
    wait_for(
        lambda: all(alias in listed(bob) for _ in range(6)),
        "bob to see alice's open model",
        timeout=120,
        every=2,
    )
    assert answer(bob, alias)
    assert observe_serve(env.dash).replica_ids.get(app_name("alice", "secret")) == before

    # The admin revokes bob's key: the daemon's next tick hands it to the endpoint.
    env.keys.write_text(f"alice {sha(ALICE_KEY)}\n")

    def refused() -> bool:
        refusals = 0
        for _ in range(6):
            try:
                listed(bob)
            except openai.AuthenticationError:
                refusals += 1
        return refusals == 6

    wait_for(refused, "bob's revoked key to be refused", timeout=120, every=2)
    assert answer(alice, alias)


def test_self_made_keys_beside_the_admins(env: Env) -> None:
    """After the first test: alice's model is open to everyone with a key; bob's admin line is gone."""
    import openai

    from tests.unit.test_git_server_keys import load_shell

    shell = load_shell()
    bob_key, bob_id = shell.key_new("bob", str(env.self_keys), 5, 0.0)
    mallory_key, _ = shell.key_new("mallory", str(env.self_keys), 5, 0.0)
    bob, mallory = env.client(bob_key), env.client(mallory_key)
    alias = f"alice-{MODEL.rsplit('/', 1)[1].removesuffix('.yaml')}"

    def refused(client: Any) -> bool:
        try:
            listed(client)
        except openai.AuthenticationError:
            return True
        return False

    def accepted(client: Any) -> bool:
        try:
            return alias in listed(client)
        except openai.AuthenticationError:
            return False  # the endpoint takes the new gate at the daemon's next tick

    wait_for(
        lambda: all(accepted(bob) for _ in range(6)),
        "bob's self-made key accepted",
        timeout=120,
        every=2,
    )
    assert answer(bob, alias)
    assert all(refused(mallory) for _ in range(6)), "a key of a user cluster.yaml does not declare"
    shell.key_revoke("bob", str(env.self_keys), bob_id)
    wait_for(lambda: all(refused(bob) for _ in range(6)), "bob's revoked key refused", timeout=120)


class Seen:
    """What one user's client received: answered requests and the usage fields of their responses."""

    def __init__(self) -> None:
        self.requests = self.prompt = self.completion = 0
        self.lock = threading.Lock()

    def add(self, usage: Any) -> None:
        assert usage is not None, "a response without usage"
        with self.lock:
            self.requests += 1
            self.prompt += usage.prompt_tokens
            self.completion += usage.completion_tokens

    def figures(self) -> tuple[int, int, int]:
        return self.requests, self.prompt, self.completion


def chat(client: Any, model: str, seen: Seen, stream: bool = False) -> None:
    """One chat completion whose usage ``seen`` records (a stream asks for its usage chunk)."""
    if not stream:
        seen.add(client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0).usage)
        return
    chunks = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1, usage
    seen.add(usage[0])


def usage_totals(env: Env) -> dict[str, tuple[int, int, int]]:
    """Per user (requests, prompt tokens, completion tokens) of the status branch's usage documents."""
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "usage", "--json", "--repo", str(env.repo.bare)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:  # no status branch yet, or no usage document
        return {}
    totals = json.loads(proc.stdout)["totals"]
    return {u: (t["requests"], t["prompt_tokens"], t["completion_tokens"]) for u, t in totals.items()}


def test_limits_429_while_others_pass_and_usage_equals_the_responses(env: Env) -> None:
    env.keys.write_text(f"alice {sha(ALICE_KEY)}\nbob {sha(BOB_KEY)}\ncarol {sha(CAROL_KEY)}\n")
    env.cluster["users"] = {"alice": {}, "bob": {}, "carol": {"requests_per_minute": CAROL_RPM}}
    env.repo.write("cluster.yaml", env.cluster)
    env.repo.write(MODEL, model_yaml(TINY, access=["*"]))
    env.repo.commit_push("carol joins with a limit; alice's model open to every key")

    def ready() -> dict[str, Any] | None:
        secret = env.status()
        ok = secret.get("state") == "RUNNING" and secret["replicas"]["ready"] == 1
        return secret if ok else None

    secret = wait_for(ready, "alice's open model RUNNING", timeout=DEPLOY_TIMEOUT_S, every=3)
    alias = secret["alias"]
    carol = env.client(CAROL_KEY)
    import openai

    def sees(client: Any) -> bool:
        try:
            return alias in listed(client)
        except openai.AuthenticationError:
            return False  # her key reaches the endpoint at the daemon's next tick

    wait_for(lambda: all(sees(carol) for _ in range(6)), "carol to see the model", timeout=120, every=2)
    # The daemon reads the endpoint's meter every 2 s; the usage it records first is the earlier
    # tests' (the meter's rows are cumulative): the figures below are what this test adds to it.
    _limits_and_usage(env, env.daemon, alias)


def _limits_and_usage(env: Env, daemon: DaemonProc, alias: str) -> None:
    import openai

    alice, bob, carol = env.client(ALICE_KEY), env.client(BOB_KEY), env.client(CAROL_KEY)
    totals: list[dict[str, tuple[int, int, int]]] = []

    def settled() -> bool:
        totals.append(usage_totals(env))
        return len(totals) > 2 and "alice" in totals[-1] and totals[-1] == totals[-2] == totals[-3]

    wait_for(settled, "the daemon to record the earlier tests' usage", timeout=180, every=3)
    before = totals[-1]
    seen = {user: Seen() for user in ("alice", "bob", "carol")}

    chat(alice, alias, seen["alice"])
    chat(alice, alias, seen["alice"], stream=True)
    chat(bob, alias, seen["bob"])

    # Carol's requests and refusals below fall within one wall-clock minute: there the sliding
    # window counts exactly (from the next minute on, her count weighs less each second).
    into = time.time() % 60
    if into > 10:
        time.sleep(60.5 - into)
    minute_end = (time.time() // 60 + 1) * 60 - 1

    # Carol, a request every 1.5 s: exactly CAROL_RPM answer.
    first: openai.RateLimitError | None = None
    for i in range(3 * CAROL_RPM):
        try:
            chat(carol, alias, seen["carol"], stream=i % 2 == 1)
        except openai.RateLimitError as exc:
            first = exc
            break
        time.sleep(1.5)
    assert first is not None and seen["carol"].requests == CAROL_RPM, seen["carol"].figures()
    assert first.status_code == 429
    body = first.response.json()
    assert body["error"]["type"] == "RateLimitExceeded" and body["error"]["code"] == 429, body
    retry_after = int(first.response.headers["retry-after"])
    assert 1 <= retry_after <= 120, retry_after

    # Carol at her limit does not stop bob: his requests, made while she keeps asking, all answer.
    refusals: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set() and time.time() < minute_end:
            try:
                chat(carol, alias, seen["carol"])
            except openai.RateLimitError as exc:
                refusals.append(int(exc.response.headers["retry-after"]))

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for i in range(4):
            chat(bob, alias, seen["bob"], stream=i % 2 == 0)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert refusals and seen["carol"].requests == CAROL_RPM, (len(refusals), seen["carol"].figures())
    assert seen["bob"].requests == 5

    # Retry-After tells the truth: after it, carol is admitted again.
    time.sleep(refusals[-1] + 0.5)
    chat(carol, alias, seen["carol"])

    # The usage documents equal what the clients received (the daemon's probes are its own user).
    mismatch: dict[str, Any] = {}

    def matches() -> bool:
        now = usage_totals(env)
        mismatch.clear()
        for user, got in seen.items():
            was = before.get(user, (0, 0, 0))
            recorded = tuple(a - b for a, b in zip(now.get(user, (0, 0, 0)), was, strict=True))
            if recorded != got.figures():
                mismatch[user] = {"recorded": recorded, "responses": got.figures()}
        return not mismatch

    try:
        wait_for(matches, "the usage documents to equal the responses' usage", timeout=180, every=3)
        time.sleep(6)  # three more reads of the meter: nothing is counted twice
        assert matches(), mismatch
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {mismatch}\n{daemon.log()[-4000:]}") from None


def _shape(body: dict[str, Any], name: str) -> tuple[Any, ...]:
    """An error body with the model name and the request id taken out: what a client can compare."""
    error = body["error"]
    message = str(error["message"]).replace(name, "<name>").split("(Request ID")[0]
    return error["type"], error.get("code"), message
