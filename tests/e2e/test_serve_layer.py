"""The Ray Serve layer against a real Ray head, Ray Serve LLM and vLLM CPU (no mocks).

Layer-level checks only, with one model load: builder -> apply -> observe of model A + the
router, the observation and capacity figures, no PUT for an identical config or for a foreign
app alone, an OpenAI-style 404. The user-visible scenarios (chat and streaming, adding a model
without touching another, embeddings, scaling in place, updates, deletes, queueing, broken
files, suspend, foreign apps across real changes) run through ``argus reconcile --once`` in
test_serving_scenarios.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.serve import apply_serve, target_apps
from reconciler.builders.serve import app_name, model_app_config, serve_config
from reconciler.dashboard import Dashboard
from reconciler.observe.capacity import observe_capacity
from reconciler.observe.serve import ServeObservation, observe_serve
from reconciler.spec.hashing import model_spec_hash
from reconciler.spec.types import ClusterSpec, ModelSpec, ObjectKey, Serving
from reconciler.testing.deps import require
from tests.support import remove_apps, wait_for

pytestmark = pytest.mark.e2e

# float32: vLLM CPU picks its kernels by processor for bfloat16 (AMX tiles on Intel Xeons that have
# them, AVX512-BF16 elsewhere, emulation without either); float32 runs the same AVX kernels on every
# x86 machine, so the suite does not depend on the processor it runs on (docs/notes/vllm-cpu.md).
ENGINE = {"max_model_len": 256, "dtype": "float32", "enforce_eager": True}
CREATED = 1764417600  # 2025-11-29 12:00 UTC
DEPLOY_TIMEOUT_S = 300.0


@dataclass
class Env:
    dash: Dashboard
    cluster: ClusterSpec
    base_url: str
    sources: dict[ObjectKey, str]
    desired: dict[ObjectKey, ModelSpec] = field(default_factory=dict)

    def apps(self) -> list[dict[str, Any]]:
        return [
            model_app_config(m, self.cluster, self.sources[k], model_spec_hash(m, self.cluster))
            for k, m in sorted(self.desired.items())
        ]

    def apply(self) -> bool:
        return apply_serve(self.dash, self.apps(), observe_serve(self.dash), self.cluster)

    def client(self) -> Any:
        import openai

        # max_retries=0: a failed request must count as failed, not be retried away.
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="none", max_retries=0, timeout=60)


def model(user: str, name: str, replicas: int = 1, **engine: Any) -> ModelSpec:
    return ModelSpec(
        key=ObjectKey(user, "model", name),
        source=f"hf:test/{name}",
        source_path=None,
        source_task=None,
        replicas=replicas,
        gpus_per_replica=1,
        engine_kwargs={**ENGINE, **engine},
        env={},
        suspend=False,
        created_at=CREATED,
    )


CHAT = model("alice", "chat")
FOREIGN = {"name": "someone-else", "route_prefix": "/foreign", "import_path": "reconciler.testing.foreign_app:app"}


def wait_running(env: Env, names: list[str], **ready: int) -> ServeObservation:
    """Wait until ``names`` are RUNNING (and apps in ``ready`` have that many RUNNING replicas)."""

    def check() -> ServeObservation | None:
        obs = observe_serve(env.dash)
        for name in names:
            status = obs.statuses.get(name)
            if status == "DEPLOY_FAILED":
                pytest.fail(f"{name} failed to deploy: {obs.messages.get(name)}")
            if status != "RUNNING":
                return None
        for name, count in ready.items():
            if len(obs.replica_ids.get(name, ())) != count:
                return None
        return obs

    return wait_for(check, f"{names} RUNNING {ready or ''}", timeout=DEPLOY_TIMEOUT_S, every=2.0)


def served(env: Env) -> set[str]:
    return {m.id for m in env.client().models.list().data}


@pytest.fixture(scope="module")
def env(ray_head: Any, tiny_llama: Path) -> Iterator[Env]:
    require("ray.serve.llm", "vllm", "openai")
    cluster = ClusterSpec(
        # The foreign app has an HTTP route: argus removes such apps unless cluster.yaml allows them.
        serving=Serving(
            accelerator="cpu",
            internal_http_port=ray_head.serve_port,
            cpus_per_replica=1.0,
            allowed_apps=(FOREIGN["name"],),
        ),
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    e = Env(
        dash=Dashboard(ray_head.dashboard_url),
        cluster=cluster,
        base_url=ray_head.serve_url,
        sources={CHAT.key: str(tiny_llama)},
    )
    e.desired[CHAT.key] = CHAT
    assert e.apply() is True
    wait_running(e, [app_name("alice", "chat"), "argus-router"])
    wait_for(lambda: CHAT.served_name in served(e), "the router to list the chat model", timeout=30)
    try:
        yield e
    finally:
        remove_apps(e.dash, lambda name: name.startswith("argus--") or name == FOREIGN["name"])


def test_chat_answers(env: Env) -> None:
    chat = env.client().chat.completions.create(
        model=CHAT.served_name, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content is not None


def test_observation_and_capacity(env: Env) -> None:
    obs = observe_serve(env.dash)
    actual = obs.models[CHAT.key]
    assert actual.status == "RUNNING"
    assert (actual.replicas, actual.ready_replicas) == (1, 1)
    assert actual.served_name == CHAT.served_name
    assert actual.spec_hash == model_spec_hash(CHAT, env.cluster)
    assert dict(actual.resources_per_replica) == {"CPU": 1.0}
    assert obs.http_options and obs.http_options["port"] == env.cluster.serving.internal_http_port
    assert obs.settings_mismatch(env.cluster) == []
    other = replace(env.cluster, serving=replace(env.cluster.serving, internal_http_port=1))
    assert "only at first start" in obs.settings_mismatch(other)[0]
    cap = observe_capacity(env.dash)
    assert cap.total == {"CPU": 8.0, "GPU": 2.0, "worker_node": 4.0}
    # The model's placement group (1 CPU) is reserved; the router and replica actors use 0.
    assert cap.available["CPU"] == pytest.approx(7.0)


def test_identical_apply_does_not_put(env: Env) -> None:
    assert env.apply() is False


def test_unknown_model_is_404(env: Env) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        env.client().chat.completions.create(
            model="nobody-202501010000-nothing", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 404
    assert "does not exist" in str(info.value.body)


def test_foreign_app_alone_is_no_reason_to_put(env: Env) -> None:
    import json
    import urllib.request

    # Deployed out of band, the way a careful human would: GET, add an app, PUT everything.
    obs = observe_serve(env.dash)
    env.dash.put("/api/serve/applications/", serve_config([*obs.apps.values(), FOREIGN], env.cluster))
    obs = wait_running(env, ["someone-else"])
    assert obs.foreign_apps() == {"someone-else": FOREIGN}
    assert env.apply() is False  # the foreign app alone is no reason to PUT
    with urllib.request.urlopen(env.base_url + "/foreign/ping", timeout=30) as resp:
        assert json.loads(resp.read()) == {"foreign": True, "path": "/foreign/ping"}
    assert observe_serve(env.dash).apps["someone-else"] == FOREIGN


def _router_replicas(env: Env) -> dict[str, tuple[str, int | None]]:
    """replica id -> (state, pid) of the router's deployment, from Serve's REST details."""
    app = env.dash.get("/api/serve/applications/")["applications"].get("argus-router") or {}
    dep = (app.get("deployments") or {}).get("ArgusRouter") or {}
    return {r["replica_id"]: (r["state"], r.get("pid")) for r in dep.get("replicas", [])}


def _running(replicas: dict[str, tuple[str, int | None]]) -> set[str]:
    return {rid for rid, (state, _pid) in replicas.items() if state == "RUNNING"}


def test_router_scales_in_place_and_survives_losing_a_replica(env: Env) -> None:
    """Two router replicas by default; a settings change keeps every replica; killing one
    router replica's process while a client loops on a model fails no request."""
    import threading

    import openai

    wait_for(
        lambda: _running(_router_replicas(env)) if len(_running(_router_replicas(env))) >= 2 else None,
        "two router replicas",
        timeout=120,
    )

    # A client with the openai library's default settings loops on the model while one
    # router replica is killed (SIGKILL: no graceful drain). Raw attempts are counted too.
    attempts = {"ok": 0, "failed": 0}

    def hook(response: Any) -> None:
        attempts["ok" if response.status_code < 500 else "failed"] += 1

    import httpx

    client = openai.OpenAI(
        base_url=env.base_url + "/v1",
        api_key="none",
        timeout=60,
        http_client=httpx.Client(event_hooks={"response": [hook]}),
    )
    results = {"ok": 0, "failed": 0}
    errors: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(
                    model=CHAT.served_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
                )
                results["ok"] += 1
            except Exception as exc:  # every failure is counted and reported
                results["failed"] += 1
                errors.append(repr(exc)[:200])

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: results["ok"] >= 20, "requests flowing", timeout=60)
        victim = sorted(_running(_router_replicas(env)))[0]
        pid = _router_replicas(env)[victim][1]
        assert pid, "Serve did not report the replica's pid"
        os.kill(pid, signal.SIGKILL)  # a process of this test's own Ray head
        killed_at = results["ok"]
        wait_for(lambda: results["ok"] >= killed_at + 60, "requests after the kill", timeout=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
    assert results["failed"] == 0, f"{results}, raw attempts {attempts}: {errors[:3]}"
    wait_for(
        lambda: len(_running(_router_replicas(env))) == 2 and victim not in _router_replicas(env),
        "Serve replaced the killed router replica",
        timeout=120,
    )

    # Scale through the deployments override: the running replicas stay (no restart).
    before = _running(_router_replicas(env))
    serving = env.cluster.serving
    env.cluster = replace(env.cluster, serving=replace(serving, router=replace(serving.router, min_replicas=3)))
    assert env.apply() is True
    grown = wait_for(
        lambda: _running(_router_replicas(env)) if len(_running(_router_replicas(env))) >= 3 else None,
        "three router replicas",
        timeout=120,
    )
    assert before <= grown, "a router settings change restarted a replica"
    env.cluster = replace(env.cluster, serving=serving)
    assert env.apply() is True  # (Serve scales down after its downscale delay, not at once)

    def min_replicas() -> int:
        app = env.dash.get("/api/serve/applications/")["applications"]["argus-router"]
        return int(app["deployed_app_config"]["deployments"][0]["autoscaling_config"]["min_replicas"])

    wait_for(lambda: min_replicas() == 2, "Serve to report min_replicas 2", timeout=60)
    assert env.apply() is False  # Serve echoes the override exactly: no PUT loop


def _put_with_refresh(env: Env, refresh_s: float) -> None:
    """PUT what ``env.apply`` would, with the router's safety refresh set to ``refresh_s``."""
    target = target_apps(env.apps(), observe_serve(env.dash), env.cluster)
    target["argus-router"]["deployments"][0]["user_config"]["refresh_s"] = refresh_s
    env.dash.put("/api/serve/applications/", serve_config([target[n] for n in sorted(target)], env.cluster))


def _router_config(env: Env) -> Any:
    return observe_serve(env.dash).apps["argus-router"]["deployments"][0].get("user_config")


def test_the_pushed_table_routes_a_new_model_in_place_without_a_poll(env: Env) -> None:
    """Adding a model pushes it to the router's table (``user_config``) in the same PUT: with the
    safety refresh set to an hour the router routes the model as soon as its replica runs, its own
    replicas stay the same (reconfigured in place), and streams in flight on another model finish.
    Removing the model is a 404 at once (the table drops it before any refresh)."""
    import threading
    import time

    import openai

    hour = 3600.0
    _put_with_refresh(env, hour)
    wait_for(lambda: (_router_config(env) or {}).get("refresh_s") == hour, "the hour-long refresh deployed", 60)
    before = wait_for(
        lambda: r if len(r := _running(_router_replicas(env))) >= 2 else None, "two router replicas", timeout=120
    )
    time.sleep(2.0)  # Serve reconfigures the replicas right after it reports the new config

    spans: list[tuple[float, float, int]] = []  # (start, end, chunks) of each finished stream
    errors: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        client = env.client()
        while not stop.is_set():
            start, chunks = time.monotonic(), 0
            try:
                for _ in client.chat.completions.create(
                    model=CHAT.served_name,
                    messages=[{"role": "user", "content": "Tell a long story."}],
                    max_tokens=120,
                    temperature=0,
                    stream=True,
                ):
                    chunks += 1
            except Exception as exc:  # every failure is counted and reported
                errors.append(repr(exc)[:200])
                continue
            spans.append((start, time.monotonic(), chunks))

    second = model("alice", "second")
    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        wait_for(lambda: len(spans) >= 1, "a first stream", timeout=60)
        env.desired[second.key] = second
        env.sources[second.key] = env.sources[CHAT.key]
        put_at = time.monotonic()
        _put_with_refresh(env, hour)
        wait_running(env, [app_name("alice", "second")], **{app_name("alice", "second"): 1})
        running_at = time.monotonic()

        def answers(name: str) -> bool | None:
            """True: answered; None: 404; False: another error (Serve between two states)."""
            try:
                env.client().chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
                )
            except openai.NotFoundError:
                return None
            except openai.APIError:
                return False
            return True

        wait_for(lambda: answers(second.served_name), "the router to route the new model", timeout=30)
        assert time.monotonic() - running_at < 30 < hour  # the table, not a poll cycle, made it routable
        assert answers("alice-second")  # its default alias too
        wait_for(lambda: any(s < put_at < e for s, e, _ in spans) or None, "a stream across the PUT", timeout=60)

        del env.desired[second.key]
        _put_with_refresh(env, hour)
        wait_for(
            lambda: answers(second.served_name) is None or None, "a 404 for the removed model", timeout=15, every=0.5
        )
    finally:
        stop.set()
        streamer.join(timeout=120)
        env.desired.pop(second.key, None)
    assert errors == [], errors[:3]
    assert all(chunks > 1 for _, _, chunks in spans)
    assert _running(_router_replicas(env)) == before  # reconfigured in place: the same replicas
    assert env.apply() is True  # back to the default table settings for the tests after this one
