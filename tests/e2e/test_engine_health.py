"""A model is RUNNING only while it answers: its vLLM engine killed under the daemon.

Real components only: a bare repository users push to, the daemon as a subprocess
(``argus run``, observe interval 1 s), a real Ray head with Ray Serve LLM and vLLM CPU, the
official OpenAI client. The model's ``VLLM::EngineCore`` process (a child of its Serve replica)
is killed with SIGKILL while the model is RUNNING:

- the first tick that starts after the kill sees the endpoint answer 500 (vLLM's
  ``EngineDeadError``) and reports the model FAILED with that error: within one observe interval
  (the tick's state, read from ``/metrics``), and on the status branch once the background writer
  commits it;
- Serve's health check (argus sets it to every 3 s) replaces the replica, and the model comes
  back to RUNNING by itself, with no push, answering the client again.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import app_name
from reconciler.dashboard import Dashboard
from reconciler.observe.serve import observe_serve
from reconciler.status.branch import read_documents
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead, engine_core_pids
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, model_yaml, remove_apps, site_repo, wait_for

pytestmark = pytest.mark.e2e

USER = "erin"
MODEL = f"users/{USER}/models/chat.yaml"
APP = app_name(USER, "chat")
OBSERVE_INTERVAL_S = 1.0  # DaemonProc's --observe-interval


@dataclass
class Env:
    repo: ConfigRepo
    daemon: DaemonProc
    dash: Dashboard
    head: RayHead


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    require("ray.serve.llm", "vllm", "openai")
    root = tmp_path_factory.mktemp("engine-health")
    repo = site_repo(root, hf_cache, ray_head.serve_port, USER)
    daemon = DaemonProc(repo, ray_head, root)
    dash = Dashboard(ray_head.dashboard_url)
    daemon.start()
    try:
        yield Env(repo, daemon, dash, ray_head)
    finally:
        daemon.stop()
        remove_apps(dash, lambda name: name == APP)


def doc(env: Env) -> dict[str, Any]:
    return read_documents(str(env.repo.bare), "argus/status").get(MODEL) or {}


def tick_states(env: Env) -> tuple[dict[str, float], float, float]:
    """The daemon's last tick's model counts by state (set as each tick ends), the number of ticks
    it has run and their total seconds, from ``/metrics``."""
    text = urllib.request.urlopen(f"http://{env.daemon.listen}/metrics", timeout=5).read().decode()
    states: dict[str, float] = {}
    ticks = seconds = 0.0
    for line in text.splitlines():
        if line.startswith('argus_objects{kind="model"'):
            states[line.split('state="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("argus_reconcile_duration_seconds_count"):
            ticks = float(line.rsplit(" ", 1)[1])
        elif line.startswith("argus_reconcile_duration_seconds_sum"):
            seconds = float(line.rsplit(" ", 1)[1])
    return states, ticks, seconds


def answer(env: Env, served: str) -> str:
    import openai

    client = openai.OpenAI(base_url=env.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=60)
    reply = client.completions.create(model=served, prompt="hi", max_tokens=2, temperature=0)
    return reply.choices[0].text


def replica_pid(env: Env) -> int:
    """The pid of the model's (one) Serve replica actor, from Ray's state API."""
    query = urllib.parse.urlencode(
        {"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE", "detail": "true", "limit": 1000}
    )
    actors = env.dash.get(f"/api/v0/actors?{query}")["data"]["result"]["result"]
    pids = [int(a["pid"]) for a in actors if f"SERVE_REPLICA::{APP}#" in str(a.get("name", ""))]
    assert len(pids) == 1, f"expected one replica of {APP}, got {pids}"
    return pids[0]


def test_a_dead_engine_leaves_running_and_comes_back(env: Env) -> None:
    env.repo.write(MODEL, model_yaml("argus-test/tiny-llama"))
    env.repo.commit_push("erin: chat model")
    first = wait_for(lambda: (d := doc(env)).get("state") == "RUNNING" and d, "the model RUNNING", timeout=300)
    served = first["served_name"]
    assert answer(env, served)
    before = observe_serve(env.dash).replica_ids[APP]

    engines = engine_core_pids(replica_pid(env))
    assert len(engines) == 1, f"expected one EngineCore under the replica, got {engines}"
    killed_at = time.monotonic()
    os.kill(engines[0], signal.SIGKILL)

    # The first tick that starts after the kill reports it, i.e. within one observe interval: at
    # most the tick in flight at the kill and the next one end before the tick's state leaves
    # RUNNING. Counted in ticks, so a loaded machine (slower ticks) does not change the verdict.
    _, ticks_at_kill, seconds_at_kill = tick_states(env)
    left = wait_for(
        lambda: (t := tick_states(env))[0].get("RUNNING", 0) == 0 and t, "the tick to leave RUNNING", every=0.1
    )
    noticed = time.monotonic() - killed_at
    ticks = left[1] - ticks_at_kill
    tick_s = (left[2] - seconds_at_kill) / max(ticks, 1)
    assert ticks <= 2, f"{ticks:.0f} ticks ({noticed:.1f} s, {tick_s:.1f} s a tick) ended before the tick left RUNNING"

    failed = wait_for(lambda: (d := doc(env)).get("state") != "RUNNING" and d, "the status branch to leave RUNNING")
    assert failed["state"] in ("FAILED", "DEPLOYING"), failed
    written = time.monotonic() - killed_at
    if failed["state"] == "FAILED":  # the probe's word (before Serve noticed): the engine's own error
        assert "does not answer" in failed.get("reason", ""), failed

    # No push: Serve's health check replaces the replica, and argus reports RUNNING once it answers.
    back = wait_for(lambda: (d := doc(env)).get("state") == "RUNNING" and d, "RUNNING again by itself", timeout=300)
    recovered = time.monotonic() - killed_at
    assert back["served_name"] == served
    assert observe_serve(env.dash).replica_ids[APP] != before, "Serve should have replaced the replica"
    assert answer(env, served)
    print(
        f"engine killed: the tick left RUNNING after {noticed:.1f} s ({ticks:.0f} ticks of {tick_s:.1f} s), "
        f"the status branch after {written:.1f} s, RUNNING again after {recovered:.1f} s"
    )
