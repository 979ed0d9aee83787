"""The serving scenarios of the Serving issue, each through the real CLI.

Every change is a commit pushed to a bare git repository; Serve follows only through
``argus reconcile --once --repo <bare> --ray <dashboard> --format json`` run as a subprocess,
repeated every ~2 s until the reported states converge. No mocks: a real Ray head (the
session's ``ray_head``), Ray Serve LLM with vLLM CPU, the official ``openai`` client.

Tests run in file order and share one history (each vLLM load costs ~25-90 s on two cores,
so the module loads a model only six times: A, B, A's second replica, A updated, C, C again):

1. deploy A -> RUNNING, listed, chat + streaming answer;
2. add B (embeddings) while a client loops on A: no failed request, A's replica kept;
3. scale A 1 -> 2 -> 1 in place: A's first replica and B untouched;
4. change A's engine_kwargs: A restarted, B untouched;
6. someone else's job fills the CPU budget: a further model C is QUEUED with the shortfall;
5. delete B: gone from /v1/models, A untouched, and C deploys on a later reconcile (6);
7. break A's file: A keeps serving, exit 1 with path:line;
9. ``suspend: true``: a later edit is not applied;
10. ``replicas: 0`` stops C (app removed, name and status kept), ``replicas: 1`` brings it back
    under the same served name;
8. an application deployed by someone else survives every reconcile (checked after each test).

``serving.cpus_per_replica`` is 2 from the first commit (changing it later would change every
model's spec hash and restart them all).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler.builders.serve import app_name, serve_config
from reconciler.dashboard import Dashboard
from reconciler.observe.capacity import observe_capacity
from reconciler.observe.serve import observe_serve
from reconciler.spec.types import ClusterSpec, Serving
from reconciler.testing.deps import require
from reconciler.testing.load import RequestLooper
from reconciler.testing.ray_head import RayHead
from tests.support import ENGINE, ConfigRepo, cluster_yaml, model_yaml, remove_apps, wait_for

pytestmark = pytest.mark.e2e

USER = "dora"
CPUS_PER_REPLICA = 2
DEPLOY_TIMEOUT_S = 300.0
TINY = "argus-test/tiny-llama"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"

A_PATH, B_PATH, C_PATH = (f"users/{USER}/models/{n}.yaml" for n in ("chat", "embed", "extra"))
A_KEY, B_KEY, C_KEY = (f"{USER}/models/{n}" for n in ("chat", "embed", "extra"))
APP_A, APP_B, APP_C = (app_name(USER, n) for n in ("chat", "embed", "extra"))
EMBED_ENGINE = {**ENGINE, "runner": "pooling", "dtype": "float32"}

FOREIGN_NAME = "dora-neighbour"
FOREIGN = {"name": FOREIGN_NAME, "route_prefix": "/neighbour", "import_path": "reconciler.testing.foreign_app:app"}


@dataclass
class Result:
    """One ``argus reconcile --once --format json`` run."""

    rc: int
    doc: dict[str, Any] | None
    stdout: str
    stderr: str

    def obj(self, key: str) -> dict[str, Any] | None:
        for o in (self.doc or {}).get("objects", []):
            if o.get("object") == key:
                return dict(o)
        return None

    def state(self, key: str) -> str | None:
        o = self.obj(key)
        return o["state"] if o else None

    def running(self, key: str, ready: int = 1) -> bool:
        o = self.obj(key)
        return bool(o and o["state"] == "RUNNING" and o["sync"] == "Synced" and o["replicas"]["ready"] == ready)

    def __str__(self) -> str:
        return f"rc={self.rc}\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-2000:]}"


@dataclass
class Env:
    repo: ConfigRepo
    head: RayHead
    dash: Dashboard
    served: dict[str, str] = field(default_factory=dict)  # object key -> served model id
    foreign_replicas: tuple[str, ...] = ()
    hog: str | None = None  # submission id of someone else's CPU-holding job
    reconciles: int = 0

    def reconcile(self, fmt: str = "json") -> Result:
        cmd = [sys.executable, "-m", "reconciler.cli", "reconcile", "--once", "--repo", str(self.repo.bare)]
        cmd += ["--ray", self.head.dashboard_url, "--format", fmt]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        self.reconciles += 1
        doc = None
        if fmt == "json":
            try:
                doc = json.loads(proc.stdout)
            except ValueError:
                doc = None
        result = Result(proc.returncode, doc, proc.stdout, proc.stderr)
        for o in (doc or {}).get("objects", []):
            if o.get("served_name"):
                self.served[o["object"]] = o["served_name"]
        return result

    def reconcile_until(
        self, predicate: Callable[[Result], Any], what: str, timeout: float = DEPLOY_TIMEOUT_S, every: float = 2.0
    ) -> Result:
        """Run ``argus reconcile --once`` every ``every`` s until ``predicate(result)`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            started = time.monotonic()
            result = self.reconcile()
            for key in (A_KEY, B_KEY, C_KEY):
                o = result.obj(key)
                if o and o["state"] == "FAILED":
                    pytest.fail(f"{key} FAILED: {o.get('reason')}\n{result}")
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last reconcile:\n{result}")
            time.sleep(max(0.0, every - (time.monotonic() - started)))

    def client(self) -> Any:
        import openai

        # max_retries=0: a failed request must count as failed, not be retried away.
        return openai.OpenAI(base_url=self.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=60)

    def listed(self) -> set[str]:
        return {m.id for m in self.client().models.list().data}

    def replicas(self, app: str) -> tuple[str, ...]:
        return observe_serve(self.dash).replica_ids.get(app, ())


def deploy_foreign(dash: Dashboard, serve_port: int) -> None:
    """Someone else deploys an app out of band, the careful way: GET everything, add theirs, PUT."""
    obs = observe_serve(dash)
    apps = [a for n, a in obs.apps.items() if n != FOREIGN_NAME]
    cluster = ClusterSpec(serving=Serving(accelerator="cpu", internal_http_port=serve_port))
    dash.put("/api/serve/applications/", serve_config([*apps, FOREIGN], cluster))


def stop_hog(env: Env) -> None:
    if env.hog:
        env.dash.post(f"/api/jobs/{env.hog}/stop")
        env.hog = None


@pytest.fixture(scope="module")
def env(
    ray_head: RayHead, tiny_llama: Path, minilm: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    require("ray.serve.llm", "vllm", "openai", "numpy")
    root = tmp_path_factory.mktemp("scenarios")
    users = root / "users"
    (users / USER).mkdir(parents=True)
    repo = ConfigRepo(root)
    doc = cluster_yaml(hf_cache, users, ray_head.serve_port)
    doc["serving"]["cpus_per_replica"] = CPUS_PER_REPLICA
    doc["serving"]["allowed_apps"] = [FOREIGN_NAME]  # it has a route: kept because the admin allows it
    repo.write("cluster.yaml", doc)
    dash = Dashboard(ray_head.dashboard_url)
    deploy_foreign(dash, ray_head.serve_port)
    e = Env(repo, ray_head, dash)
    obs = wait_for(
        lambda: (o := observe_serve(dash)).statuses.get(FOREIGN_NAME) == "RUNNING" and o, "the foreign app RUNNING"
    )
    e.foreign_replicas = obs.replica_ids[FOREIGN_NAME]
    try:
        yield e
    finally:
        stop_hog(e)
        remove_apps(dash, lambda n: n.startswith(f"argus--{USER}--") or n == FOREIGN_NAME)


def assert_foreign_untouched(env: Env) -> None:
    """Scenario 8, after every scenario: the foreign app runs as deployed, same replica."""
    obs = observe_serve(env.dash)
    assert obs.statuses.get(FOREIGN_NAME) == "RUNNING"
    assert obs.apps[FOREIGN_NAME] == FOREIGN
    assert obs.replica_ids[FOREIGN_NAME] == env.foreign_replicas
    with urllib.request.urlopen(env.head.serve_url + "/neighbour/ping", timeout=30) as resp:
        assert json.loads(resp.read()) == {"foreign": True, "path": "/neighbour/ping"}


def test_1_deploy_chat_and_stream(env: Env) -> None:
    env.repo.write(A_PATH, model_yaml(TINY))
    env.repo.commit_push("dora: deploy chat")
    first = env.reconcile()
    assert first.rc == 0, first
    assert first.state(A_KEY) == "DEPLOYING", first
    env.reconcile_until(lambda r: r.running(A_KEY), "A RUNNING")
    served = env.served[A_KEY]
    assert served.startswith(f"{USER}-") and served.endswith("-chat")
    wait_for(lambda: served in env.listed(), "/v1/models to list A")

    client = env.client()
    chat = client.chat.completions.create(
        model=served, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content is not None
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    chunks = list(client.completions.create(model=served, prompt="Once upon", max_tokens=8, temperature=0, stream=True))
    assert len(chunks) >= 2
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert env.reconcile().rc == 0  # converged: a further tick changes nothing
    assert_foreign_untouched(env)


def test_2_add_embedding_model_while_a_serves(env: Env) -> None:
    import numpy as np

    a_before = env.replicas(APP_A)
    assert len(a_before) == 1
    with RequestLooper(env.client(), env.served[A_KEY]) as looper:
        env.repo.write(B_PATH, model_yaml(MINILM, engine_kwargs=dict(EMBED_ENGINE)))
        env.repo.commit_push("dora: add embed")
        env.reconcile_until(lambda r: r.running(B_KEY) and r.running(A_KEY), "B RUNNING next to A")
        wait_for(lambda: env.served[B_KEY] in env.listed(), "/v1/models to list B")
        time.sleep(2)
    assert looper.failures == []
    assert looper.ok > 10
    assert env.replicas(APP_A) == a_before

    texts = ["a cat sits on the mat", "a kitten is sitting on a rug", "stock markets fell sharply"]
    result = env.client().embeddings.create(model=env.served[B_KEY], input=texts)
    vectors = [np.asarray(d.embedding) for d in result.data]
    assert [len(v) for v in vectors] == [384, 384, 384]

    def cos(a: Any, b: Any) -> float:
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2])
    assert_foreign_untouched(env)


def test_3_scale_in_place(env: Env) -> None:
    (first,) = env.replicas(APP_A)
    b_before = env.replicas(APP_B)
    env.repo.write(A_PATH, model_yaml(TINY, replicas=2))
    env.repo.commit_push("dora: chat x2")
    env.reconcile_until(lambda r: r.running(A_KEY, ready=2), "A with 2 ready replicas")
    assert first in env.replicas(APP_A) and len(env.replicas(APP_A)) == 2
    assert env.replicas(APP_B) == b_before

    env.repo.write(A_PATH, model_yaml(TINY, replicas=1))
    env.repo.commit_push("dora: chat x1")
    env.reconcile_until(lambda r: r.running(A_KEY, ready=1) and len(env.replicas(APP_A)) == 1, "A back to 1")
    assert env.replicas(APP_A) == (first,)
    assert env.replicas(APP_B) == b_before
    assert_foreign_untouched(env)


def test_4_engine_kwargs_change_restarts_only_a(env: Env) -> None:
    a_before, b_before = env.replicas(APP_A), env.replicas(APP_B)
    env.repo.write(A_PATH, model_yaml(TINY, engine_kwargs={**ENGINE, "max_model_len": 200}))
    env.repo.commit_push("dora: chat max_model_len 200")
    first = env.reconcile()
    assert first.rc == 0 and first.state(A_KEY) == "DEPLOYING", first
    (update,) = [a for a in (first.doc or {})["plan"]["actions"] if a["object"] == A_KEY]
    # The field-level diff comes from the spec the running app recorded when it was deployed.
    assert update["action"] == "update_model", update
    assert update["changed"] == [f"engine_kwargs.max_model_len: {ENGINE['max_model_len']} → 200"], update
    env.reconcile_until(
        lambda r: r.running(A_KEY) and (ids := env.replicas(APP_A)) and not set(ids) & set(a_before),
        "A RUNNING on a new replica",
    )
    assert env.replicas(APP_B) == b_before
    config = observe_serve(env.dash).apps[APP_A]
    assert config["args"]["llm_config"]["engine_kwargs"]["max_model_len"] == 200
    served = env.served[A_KEY]
    wait_for(lambda: served in env.listed(), "/v1/models to list A again")
    reply = env.client().chat.completions.create(
        model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None
    assert_foreign_untouched(env)


def test_6_full_capacity_queues_a_further_model(env: Env) -> None:
    # Someone else's job takes all free CPUs but one: a further model (2 CPUs) cannot fit.
    free = observe_capacity(env.dash).available.get("CPU", 0.0)
    hog = free - (CPUS_PER_REPLICA - 1)
    assert hog > 0, f"expected free CPUs on the head, found {free}"
    sid = f"{FOREIGN_NAME}-hog-{uuid.uuid4().hex[:8]}"
    env.dash.post("/api/jobs/", {"entrypoint": "sleep 900", "submission_id": sid, "entrypoint_num_cpus": hog})
    env.hog = sid
    wait_for(lambda: env.dash.get(f"/api/jobs/{sid}").get("status") == "RUNNING", "the CPU hog running")
    wait_for(lambda: observe_capacity(env.dash).available.get("CPU") == CPUS_PER_REPLICA - 1, "the CPU budget full", 30)
    a_before, b_before = env.replicas(APP_A), env.replicas(APP_B)

    env.repo.write(C_PATH, model_yaml(TINY))
    env.repo.commit_push("dora: add extra")
    for _ in range(2):  # queued, and stays queued on a later tick (no over-commit)
        result = env.reconcile()
        assert result.rc == 0, result
        c = result.obj(C_KEY)
        assert c is not None and c["state"] == "QUEUED", result
        assert "insufficient capacity" in c["reason"], c
        assert f"needs {CPUS_PER_REPLICA} CPU, free 1 CPU (short by 1 CPU)" in c["reason"], c
        assert APP_C not in observe_serve(env.dash).apps
        time.sleep(2)
    assert env.replicas(APP_A) == a_before and env.replicas(APP_B) == b_before
    assert_foreign_untouched(env)


def test_5_delete_removes_b_and_admits_the_queued_model(env: Env) -> None:
    a_before = env.replicas(APP_A)
    served_b = env.served[B_KEY]
    env.repo.remove(B_PATH)
    env.repo.commit_push("dora: delete embed")
    first = env.reconcile()
    assert first.rc == 0, first
    assert first.state(B_KEY) == "DELETING", first
    assert first.state(C_KEY) == "QUEUED", first  # B's CPUs are not free yet
    env.reconcile_until(
        lambda r: r.obj(B_KEY) is None and r.running(C_KEY), "B gone and the queued C RUNNING in its place"
    )
    assert APP_B not in observe_serve(env.dash).apps
    wait_for(lambda: served_b not in env.listed(), "/v1/models to drop B", timeout=30)
    wait_for(lambda: env.served[C_KEY] in env.listed(), "/v1/models to list C", timeout=30)
    assert env.served[A_KEY] in env.listed()
    assert env.replicas(APP_A) == a_before
    reply = env.client().completions.create(model=env.served[A_KEY], prompt="hi", max_tokens=2)
    assert reply.choices
    stop_hog(env)
    assert_foreign_untouched(env)


BROKEN = f"kind: Model\nsource: {TINY}\nreplicas: two\n"


def test_7_broken_file_keeps_a_serving(env: Env) -> None:
    a_before, c_before = env.replicas(APP_A), env.replicas(APP_C)
    good = (env.repo.work / A_PATH).read_text()
    env.repo.write(A_PATH, BROKEN)
    env.repo.commit_push("dora: typo")
    result = env.reconcile()
    assert result.rc == 1, result
    assert result.doc is not None
    errors = [e for e in result.doc["errors"] if e["path"] == A_PATH]
    assert errors and errors[0]["line"] == 3 and "replicas" in errors[0]["message"], result.doc["errors"]
    a = result.obj(A_KEY)
    assert a is not None and a["state"] == "RUNNING" and a["sync"] == "Invalid", a
    text = env.reconcile(fmt="text")
    assert text.rc == 1
    assert f"{A_PATH}:3: replicas" in text.stderr, text
    assert env.replicas(APP_A) == a_before and env.replicas(APP_C) == c_before
    reply = env.client().completions.create(model=env.served[A_KEY], prompt="hi", max_tokens=2)
    assert reply.choices

    env.repo.write(A_PATH, good)
    env.repo.commit_push("dora: fix typo")
    assert env.reconcile_until(lambda r: r.rc == 0 and r.running(A_KEY), "A Synced again", timeout=30)
    assert env.replicas(APP_A) == a_before
    assert_foreign_untouched(env)


def test_9_suspended_model_ignores_later_edits(env: Env) -> None:
    a_before = env.replicas(APP_A)
    spec = model_yaml(TINY, engine_kwargs={**ENGINE, "max_model_len": 200})
    env.repo.write(A_PATH, {**spec, "suspend": True})
    env.repo.commit_push("dora: suspend chat")
    result = env.reconcile()
    assert result.rc == 0, result
    assert (result.obj(A_KEY) or {}).get("sync") == "Suspended", result

    env.repo.write(A_PATH, {**spec, "replicas": 2, "suspend": True})
    env.repo.commit_push("dora: chat x2 while suspended")
    for _ in range(3):
        result = env.reconcile()
        assert result.rc == 0, result
        a = result.obj(A_KEY)
        assert a is not None and a["sync"] == "Suspended" and a["state"] == "RUNNING", a
        assert a["replicas"] == {"desired": 2, "ready": 1}, a
        time.sleep(2)
    obs = observe_serve(env.dash)
    assert obs.replica_ids[APP_A] == a_before
    assert obs.apps[APP_A]["deployments"][0]["num_replicas"] == 1
    assert_foreign_untouched(env)


def test_10_scale_to_zero_and_back_keeps_the_name(env: Env) -> None:
    """``replicas: 0`` removes C's Serve application and frees its CPUs, keeping its file, status and
    served name (STOPPED); ``replicas: 1`` deploys it again under the same name."""
    served = env.served[C_KEY]
    env.repo.write(C_PATH, model_yaml(TINY, replicas=0))
    env.repo.commit_push("dora: stop extra for now")
    first = env.reconcile()
    assert first.rc == 0, first
    (stop,) = [a for a in (first.doc or {})["plan"]["actions"] if a["object"] == C_KEY]
    assert stop["action"] == "stop_model", stop
    stopped = env.reconcile_until(lambda r: r.state(C_KEY) == "STOPPED", "C STOPPED", timeout=60)
    c = stopped.obj(C_KEY)
    assert c is not None and c["sync"] == "Synced" and c["served_name"] == served, c
    assert c["replicas"] == {"desired": 0, "ready": 0}, c
    assert APP_C not in observe_serve(env.dash).apps
    wait_for(lambda: served not in env.listed(), "/v1/models to drop C", timeout=30)

    env.repo.write(C_PATH, model_yaml(TINY, replicas=1))
    env.repo.commit_push("dora: extra back")
    env.reconcile_until(lambda r: r.running(C_KEY), "C RUNNING again")
    assert env.served[C_KEY] == served  # the same name: clients written against it keep working
    wait_for(lambda: served in env.listed(), "/v1/models to list C again", timeout=30)
    reply = env.client().completions.create(model=served, prompt="hi", max_tokens=2)
    assert reply.choices
    assert_foreign_untouched(env)
