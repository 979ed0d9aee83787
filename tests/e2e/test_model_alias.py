"""Stable model aliases (issue 21 item 6) through the official OpenAI client on a real Serve.

One push deploys two tiny models of user ``ivy``: ``chat`` (default alias ``ivy-chat``) and
``prod`` (``served_name: ivy-live``). Through the router: ``/v1/models`` lists both dated names
and both aliases; a chat completion and a stream by alias answer exactly as the dated name
does (greedy decoding). Then the hostile case: user ``mal`` names a model ``ivy-chat``; the
reconcile fails with ``path:line``, no application is created for it, and ``ivy-chat`` still
answers from ivy's model. Every step runs the real ``argus reconcile --once`` CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import app_name
from reconciler.dashboard import Dashboard
from reconciler.observe.serve import observe_serve
from reconciler.testing.ray_head import RayHead
from tests.support import ConfigRepo, cluster_yaml, model_yaml, remove_apps, wait_for

pytestmark = pytest.mark.e2e

USER, OTHER = "ivy", "mal"
TINY = "argus-test/tiny-llama"
DEPLOY_TIMEOUT_S = 900.0  # two vLLM loads side by side on a loaded 2-core machine
QUESTION = [{"role": "user", "content": "Say hello"}]


@dataclass
class Env:
    repo: ConfigRepo
    head: RayHead
    dash: Dashboard

    def reconcile(self) -> tuple[int, dict[str, Any], str]:
        cmd = [sys.executable, "-m", "reconciler.cli", "reconcile", "--once", "--repo", str(self.repo.bare)]
        cmd += ["--ray", self.head.dashboard_url, "--format", "json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        try:
            doc = json.loads(proc.stdout)
        except ValueError as exc:
            raise AssertionError(f"no JSON (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}") from exc
        return proc.returncode, doc, proc.stderr

    def objects(self, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {o["object"]: o for o in doc.get("objects", [])}


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("alias")
    users = root / "users"
    for user in (USER, OTHER):
        (users / user).mkdir(parents=True)
    repo = ConfigRepo(root)
    repo.write("cluster.yaml", cluster_yaml(hf_cache, users, ray_head.serve_port))
    repo.commit_push("cluster")
    dash = Dashboard(ray_head.dashboard_url)
    try:
        yield Env(repo, ray_head, dash)
    finally:
        remove_apps(dash, lambda name: name.startswith((f"argus--{USER}--", f"argus--{OTHER}--")))


@pytest.fixture(scope="module")
def client(env: Env) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{env.head.serve_port}/v1", api_key="none", max_retries=0)


def listed(client: Any) -> set[str]:
    return {m.id for m in client.models.list().data}


def answer(client: Any, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    return str(reply.choices[0].message.content)


def test_aliases_are_listed_and_answer_like_the_dated_name(env: Env, client: Any) -> None:
    env.repo.write(f"users/{USER}/models/chat.yaml", model_yaml(TINY))
    env.repo.write(f"users/{USER}/models/prod.yaml", model_yaml(TINY, served_name="ivy-live"))
    env.repo.commit_push("ivy: two models")

    def running() -> dict[str, dict[str, Any]] | None:
        rc, doc, stderr = env.reconcile()
        assert rc == 0, (doc, stderr)
        objs = env.objects(doc)
        chat, prod = objs.get(f"{USER}/models/chat"), objs.get(f"{USER}/models/prod")
        both = chat and prod and all(o["state"] == "RUNNING" and o["replicas"]["ready"] == 1 for o in (chat, prod))
        return objs if both else None

    objs = wait_for(running, "both of ivy's models RUNNING", timeout=DEPLOY_TIMEOUT_S, every=3)
    chat, prod = objs[f"{USER}/models/chat"], objs[f"{USER}/models/prod"]
    assert chat["alias"] == "ivy-chat" and prod["alias"] == "ivy-live"
    dated_chat, dated_prod = chat["served_name"], prod["served_name"]
    assert dated_chat.startswith("ivy-2") and dated_chat.endswith("-chat")

    names = wait_for(
        lambda: (n := listed(client)) >= {dated_chat, dated_prod, "ivy-chat", "ivy-live"} and n,
        "the router to list both dated names and both aliases",
        timeout=60,
        every=1,
    )
    assert "ivy-prod" not in names  # a served_name replaces the default alias
    # Listed by one router replica means found by every one (there are two; each request may
    # reach either): a replica that has not seen the model run yet reads Serve before a 404.
    retrieved = [
        client.models.retrieve(n).id for _ in range(6) for n in (dated_chat, dated_prod, "ivy-chat", "ivy-live")
    ]
    assert retrieved == [dated_chat, dated_prod, "ivy-chat", "ivy-live"] * 6

    assert answer(client, "ivy-chat") == answer(client, dated_chat)
    assert answer(client, "ivy-live") == answer(client, dated_prod)
    stream = client.chat.completions.create(
        model="ivy-live", messages=QUESTION, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == answer(client, dated_prod)


def test_another_user_cannot_take_an_alias(env: Env, client: Any) -> None:
    path = f"users/{OTHER}/models/steal.yaml"
    env.repo.write(path, model_yaml(TINY, served_name="ivy-chat"))
    env.repo.commit_push("mal: a model named like ivy's")
    rc, doc, stderr = env.reconcile()
    assert rc == 1, (doc, stderr)
    errors = [f"{e['path']}:{e['line']}: {e['message']}" for e in doc.get("errors", [])]
    assert any(e.startswith(f"{path}:") and "must start with 'mal-'" in e for e in errors), errors
    time.sleep(3)  # two router refreshes
    assert app_name(OTHER, "steal") not in observe_serve(env.dash).apps
    before = answer(client, "ivy-chat")
    dated = env.objects(doc)[f"{USER}/models/chat"]["served_name"]
    assert before == answer(client, dated)
    assert "ivy-chat" in listed(client)
