"""Models on a Ray cluster of their own (cluster.yaml ``serving.ray_address``), against two real Ray
heads with token auth, each its own token, and ``argus run`` ticking.

The jobs head runs the task; the serving head runs the model and the Serve proxy the endpoint
forwards to. The daemon holds both tokens (``ARGUS_RAY_TOKEN``, ``ARGUS_SERVING_RAY_TOKEN``, the
latter sent only to ``ARGUS_SERVING_RAY``); the
jobs cluster's token, the one every job's code holds, is refused by the serving cluster's dashboard,
so no job can deploy, replace or call anything there. Admission sees both clusters' resources
(``actual.json``'s capacity is their sum), and the model answers the official ``openai`` client
through the daemon's endpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.errors import RayUnavailable
from reconciler.status.branch import read_documents
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead, free_port
from tests.support import ArgusRun, ConfigRepo, cluster_yaml, git, model_yaml, wait_for

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
JOBS_TOKEN, SERVING_TOKEN = secrets.token_hex(32), secrets.token_hex(32)
USER = "erin"
MODEL, TASK = f"users/{USER}/models/chat.yaml", f"users/{USER}/tasks/prep.yaml"
MODEL_APP, SID = f"argus--{USER}--chat", f"argus--{USER}--prep--"
MODEL_LOAD_S = 600.0  # a vLLM CPU model load on a busy 2-core machine
HEAD_START_TRIES = 3  # a free port can be taken by someone else's head before ours binds it


@dataclass
class Env:
    jobs: RayHead
    serving: RayHead
    jobs_dash: Dashboard
    serving_dash: Dashboard
    repo: ConfigRepo
    daemon: ArgusRun


def _head(token: str, cpus: int, gpus: int, resources: dict[str, float]) -> RayHead:
    from reconciler.testing.ray_head import start_head

    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    for attempt in range(HEAD_START_TRIES):
        try:
            return start_head(num_cpus=cpus, num_gpus=gpus, resources=resources, env=env, auth_token=token)
        except RuntimeError:  # a free port taken by another head meanwhile (shared machines)
            if attempt == HEAD_START_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _stop(head: RayHead) -> None:
    head.stop()
    if not os.environ.get("ARGUS_KEEP_RAY_LOGS"):
        shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def env(tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    require("ray", "ray.serve", "ray.serve.llm", "vllm", "openai")
    jobs = _head(JOBS_TOKEN, 2, 1, {"worker_node": 2})  # the task takes a (logical) GPU
    try:
        serving = _head(SERVING_TOKEN, 4, 2, {})
    except BaseException:
        _stop(jobs)
        raise
    root = tmp_path_factory.mktemp("serving-cluster")
    (root / "users" / USER).mkdir(parents=True)
    repo = ConfigRepo(root)
    doc = cluster_yaml(hf_cache, root / "users", serving.serve_port)
    doc["serving"]["ray_address"] = serving.dashboard_url
    repo.write("cluster.yaml", doc)
    repo.write(MODEL, model_yaml("argus-test/tiny-llama"))
    repo.write(TASK, {"kind": "Task", "workload": "command", "command": "echo prepared"})
    repo.commit_push(f"{USER}: a model and a task")
    args = ["--repo", str(repo.bare), "--ray", jobs.dashboard_url, "--listen", f"127.0.0.1:{free_port()}"]
    args += ["--observe-interval", "1", "--cache-dir", str(root / "cache")]
    daemon_env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGUS_", "RAY_AUTH"))}
    daemon_env.update(
        ARGUS_RAY_TOKEN=JOBS_TOKEN, ARGUS_SERVING_RAY_TOKEN=SERVING_TOKEN, ARGUS_SERVING_RAY=serving.dashboard_url
    )
    daemon = ArgusRun(args, root / "daemon.log", daemon_env).start()
    try:
        yield Env(
            jobs,
            serving,
            Dashboard(jobs.dashboard_url, token=JOBS_TOKEN),
            Dashboard(serving.dashboard_url, token=SERVING_TOKEN),
            repo,
            daemon,
        )
    finally:
        daemon.stop()
        _stop(serving)
        _stop(jobs)


def _chat(env: Env) -> ChatCompletion | None:
    """The model's answer through the daemon's endpoint (None: not answering yet). A random-weight
    model's two tokens may be empty text: an answer is one with a choice."""
    from openai import OpenAI, OpenAIError

    client = OpenAI(base_url=f"{env.daemon.openai_url}/v1", api_key="none", max_retries=0, timeout=60)
    try:
        out = client.chat.completions.create(
            model=f"{USER}-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    except OpenAIError:
        return None
    return out if out.choices else None


def _apps(dash: Dashboard) -> dict[str, Any]:
    return dict((dash.get("/api/serve/applications/") or {}).get("applications") or {})


def _task_jobs(dash: Dashboard) -> list[dict[str, Any]]:
    return [j for j in dash.get("/api/jobs/") or [] if str(j.get("submission_id", "")).startswith(SID)]


def _status(env: Env) -> dict[str, Any]:
    return read_documents(str(env.repo.bare), "argus/status")


def test_models_run_on_the_serving_cluster_and_tasks_on_the_jobs_cluster(env: Env) -> None:
    assert wait_for(lambda: _chat(env), "erin's model answering through the endpoint", MODEL_LOAD_S, every=3)
    wait_for(lambda: (_status(env).get(TASK) or {}).get("state") == "SUCCEEDED", "the task SUCCEEDED", timeout=300)
    # The model's application and Serve itself are on the serving cluster only.
    assert MODEL_APP in _apps(env.serving_dash)
    assert _apps(env.jobs_dash) == {}, "argus deployed something on the jobs cluster"
    # The task ran on the jobs cluster only.
    assert [j["status"] for j in _task_jobs(env.jobs_dash)] == ["SUCCEEDED"]
    assert _task_jobs(env.serving_dash) == []
    # RUNNING once the daemon's own probe (through the serving cluster's proxy) has had its answer: the
    # status commit may follow the first answer the client saw by a tick or two.
    wait_for(lambda: (_status(env).get(MODEL) or {}).get("state") == "RUNNING", "the model RUNNING", timeout=120)
    # Admission counts both clusters: 2 + 4 CPUs, 1 + 2 GPUs, and the jobs head's worker_node slots.
    actual = json.loads(git(env.repo.bare, "show", "argus/status:actual.json"))
    assert actual["capacity"]["total"]["CPU"] == pytest.approx(6.0), actual["capacity"]
    assert actual["capacity"]["total"]["GPU"] == pytest.approx(3.0), actual["capacity"]
    assert actual["capacity"]["total"]["worker_node"] == pytest.approx(2.0), actual["capacity"]


def test_the_jobs_token_is_refused_by_the_serving_cluster(env: Env) -> None:
    """What every job's code holds (the jobs cluster's token) opens nothing on the serving cluster:
    not its Serve applications, not its jobs. Not vacuous: the serving token is accepted."""
    wait_for(lambda: MODEL_APP in _apps(env.serving_dash), "erin's application on the serving cluster", MODEL_LOAD_S)
    as_a_job = Dashboard(env.serving.dashboard_url, token=JOBS_TOKEN)
    for path in ("/api/serve/applications/", "/api/jobs/"):
        with pytest.raises(RayUnavailable, match="refused"):
            as_a_job.get(path)
    with pytest.raises(RayUnavailable, match="refused"):
        as_a_job.put("/api/serve/applications/", {"applications": []})
    assert MODEL_APP in _apps(env.serving_dash)
