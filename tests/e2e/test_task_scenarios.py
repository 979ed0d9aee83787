"""Training tasks end to end (issue 4), every step through the real ``argus reconcile --once``
CLI: a real git repository (bare + clone), real Ray Jobs on the session's Ray head (2 logical
GPUs, 4 ``worker_node`` units), Ray Serve + vLLM CPU for the trained model, no mocks.

Jobs are counted through the Jobs REST API (``GET /api/jobs/``). Tests run in file order and
share one repository for user ``frank``; each scenario leaves no job of its own running.
The model trained in the first test deploys while the other scenarios run; the last test
waits for it and calls it through the OpenAI client (vLLM on CPU takes a minute to start).
Serve apps ``argus--frank--*`` and any still-running frank job are removed at module end.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.jobs import stop_job
from reconciler.dashboard import Dashboard
from reconciler.observe.capacity import observe_capacity
from reconciler.observe.serve import observe_serve
from reconciler.testing.ray_head import RayHead
from tests.support import ConfigRepo, model_yaml, remove_apps, site_repo

pytestmark = pytest.mark.e2e

USER = "frank"
REPO_ROOT = Path(__file__).resolve().parents[2]
PY = shlex.quote(sys.executable)
ACTIVE = {"PENDING", "RUNNING"}
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# Shared by the fine-tune scenario and the last test (the model deploys meanwhile).
TRAINED: dict[str, str] = {}


@dataclass
class Env:
    repo: ConfigRepo
    head: RayHead
    dash: Dashboard
    users: Path
    root: Path
    tiny_llama: Path


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("tasks")
    users = root / "users"
    repo = site_repo(root, hf_cache, ray_head.serve_port, USER)
    repo.commit_push("cluster")
    dash = Dashboard(ray_head.dashboard_url)
    try:
        yield Env(repo, ray_head, dash, users, root, tiny_llama)
    finally:
        _cleanup(dash)


def _cleanup(dash: Dashboard) -> None:
    """Stop frank's jobs that still run and remove frank's Serve apps (the rest stays as it is)."""
    for job in frank_jobs(dash):
        if job.get("status") in ACTIVE:
            stop_job(dash, str(job["submission_id"]))
    remove_apps(dash, lambda name: name.startswith(f"argus--{USER}--"))


# -- helpers ------------------------------------------------------------------------------


@dataclass
class Result:
    """One ``argus reconcile --once --format json`` run."""

    rc: int
    out: dict[str, Any]
    stderr: str

    def obj(self, name: str, kind: str = "task") -> dict[str, Any]:
        """The ``objects`` entry of ``frank/<kind>s/<name>`` ({} when absent)."""
        want = f"{USER}/{kind}s/{name}"
        return next((o for o in self.out.get("objects", []) if o.get("object") == want), {})

    def state(self, name: str, kind: str = "task") -> str | None:
        return self.obj(name, kind).get("state")


def reconcile(env: Env) -> Result:
    """Run ``argus reconcile --once`` as a fresh process; parse its JSON."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "reconcile",
            "--once",
            "--repo",
            str(env.repo.bare),
            "--branch",
            "main",
            "--ray",
            env.head.dashboard_url,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ARGUS_CACHE_DIR": str(env.root / "cache")},
        cwd=REPO_ROOT,
        check=False,
    )
    try:
        out = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(
            f"reconcile printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        ) from exc
    return Result(proc.returncode, out, proc.stderr)


def reconcile_until(
    env: Env, predicate: Callable[[Result], Any], what: str, timeout: float = 120.0, every: float = 1.0
) -> Result:
    """Reconcile (one fresh process per tick) until ``predicate(result)`` holds; return that result."""
    deadline = time.monotonic() + timeout
    last: Result | None = None
    while True:
        last = reconcile(env)
        if predicate(last):
            return last
        if time.monotonic() > deadline:
            objects = [o for o in last.out.get("objects", []) if o.get("object", "").startswith(f"{USER}/")]
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}; last rc {last.rc}, failures "
                f"{last.out.get('failures')}, objects {json.dumps(objects, indent=1)}\n{last.stderr[-2000:]}"
            )
        time.sleep(every)


def frank_jobs(dash: Dashboard, task: str | None = None) -> list[dict[str, Any]]:
    """frank's Ray jobs (every state) straight from the Jobs REST API."""
    prefix = f"argus--{USER}--{task}--" if task else f"argus--{USER}--"
    return [j for j in dash.get("/api/jobs/") if str(j.get("submission_id") or "").startswith(prefix)]


def job_by_id(dash: Dashboard, sid: str) -> dict[str, Any]:
    return next(j for j in dash.get("/api/jobs/") if j.get("submission_id") == sid)


def wait_job(dash: Dashboard, sid: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = job_by_id(dash, sid)
        if job.get("status") in states:
            return job
        time.sleep(0.5)
    raise AssertionError(f"{sid} did not reach {states}: {job.get('status')} {job.get('message')}")


def wait_gpus_free(env: Env, gpus: float = 2.0, timeout: float = 60.0) -> None:
    """Wait until Ray reports ``gpus`` GPUs available. Ray's resource report lags a job's end by
    a few seconds, and the planner admits by what Ray reports (then a task is QUEUED a tick
    longer): each scenario starts on an idle cluster so its first tick is deterministic."""
    deadline = time.monotonic() + timeout
    free = 0.0
    while time.monotonic() < deadline:
        free = observe_capacity(env.dash).available.get("GPU", 0.0)
        if free >= gpus:
            return
        time.sleep(0.5)
    raise AssertionError(f"only {free:g} GPUs free after {timeout:.0f} s")


def why(result: Result, name: str) -> str:
    """Why ``name`` is in the state it is: its state and reason, the tick's notes and every
    object's state (a failure message pytest does not shorten)."""
    obj = result.obj(name)
    others = {o.get("object"): (o.get("state"), o.get("reason")) for o in result.out.get("objects", [])}
    seen = {"notes": result.out.get("notes"), "objects": others}
    return f"{name} {obj.get('state')}: {obj.get('reason')!r}; {json.dumps(seen, default=str)[:3000]}"


def task_yaml(command: str, gpus: int = 1, **fields: Any) -> dict[str, Any]:
    return {"kind": "Task", "workload": "command", "command": command, "gpus_per_node": gpus, **fields}


def task_path(name: str) -> str:
    return f"users/{USER}/tasks/{name}.yaml"


# -- 1. train -> serve ------------------------------------------------------------------------


def test_command_task_fine_tunes_and_the_model_serves_it(env: Env) -> None:
    """A CPU fine-tune of the tiny Llama as a `command` task -> SUCCEEDED with a HF checkpoint;
    a model with `source: task:tune` waits QUEUED for it, then deploys from its checkpoint."""
    repo, dash = env.repo, env.dash
    base = shlex.quote(str(env.tiny_llama))
    command = f"{PY} -m reconciler.testing.finetune_tiny {base} $ARGUS_CHECKPOINT_DIR/hf --steps 3"
    wait_gpus_free(env)
    repo.write(task_path("tune"), task_yaml(command))
    repo.write(f"users/{USER}/models/tuned.yaml", model_yaml("task:tune"))
    repo.commit_push("frank: fine-tune and serve")

    first = reconcile(env)
    assert first.rc == 0, (first.out, first.stderr)
    assert first.state("tune") == "SUBMITTED"
    sid = first.obj("tune")["submission_id"]
    assert sid.startswith(f"argus--{USER}--tune--")
    model = first.obj("tuned", "model")
    assert model["state"] == "QUEUED" and "waiting for task tune" in model["reason"]

    done = reconcile_until(env, lambda r: r.state("tune") in FINAL or r.state("tuned", "model") != "QUEUED", "tune")
    assert done.state("tune") == "SUCCEEDED", done.obj("tune")
    run = next(r for r in done.obj("tune")["runs"] if r["submission_id"] == sid)
    checkpoint = run.get("checkpoint") or ""
    assert checkpoint == str(env.users / USER / "jobs" / "tune" / sid / "checkpoints" / "hf")
    assert (Path(checkpoint) / "config.json").is_file()
    assert any("saved" in line for line in run.get("log_tail", [])), run

    # The tick that saw the success deployed the model; it keeps deploying while the next
    # scenarios run (reconciles PUT nothing unchanged), and test_trained_model_answers_last
    # waits for it: vLLM on CPU takes a minute or more to start.
    assert done.state("tuned", "model") == "DEPLOYING", done.obj("tuned", "model")
    deploy = next(a for a in done.out["plan"]["actions"] if a["object"] == f"{USER}/models/tuned")
    assert deploy["action"] == "deploy_model" and deploy["source_path"] == checkpoint
    # Serve lists a PUT's apps once its controller has taken the config (on a head where Serve
    # was not running yet, that is a few seconds after the PUT).
    deadline = time.monotonic() + 180  # Serve's first start on a loaded 2-core machine can take minutes
    while f"argus--{USER}--tuned" not in observe_serve(dash).apps:
        assert time.monotonic() < deadline, "Serve never listed the model's application"
        time.sleep(0.5)
    TRAINED["checkpoint"] = checkpoint


# -- 2. GPU admission --------------------------------------------------------------------------


def test_second_two_gpu_task_waits_for_the_first(env: Env) -> None:
    """Two 2-GPU tasks on a 2-GPU cluster: first come first served, the second is QUEUED with the
    shortfall in its reason and no Ray job until the first finishes, then it runs."""
    repo, dash = env.repo, env.dash
    wait_gpus_free(env)
    repo.write(task_path("big-a"), task_yaml("sleep 8", gpus=2))
    repo.write(task_path("big-b"), task_yaml("sleep 1", gpus=2))
    repo.commit_push("frank: two 2-GPU tasks")

    first = reconcile(env)
    assert first.rc == 0, (first.out, first.stderr)
    assert first.state("big-a") == "SUBMITTED", why(first, "big-a")
    queued = first.obj("big-b")
    assert queued["state"] == "QUEUED" and queued["submission_id"] is None
    assert "insufficient capacity" in queued["reason"] and "short by 2 GPU" in queued["reason"], queued

    # While big-a holds the GPUs big-b stays queued and is never submitted.
    waiting = 0
    while True:
        result = reconcile(env)
        a_job = frank_jobs(dash, "big-a")
        assert len(a_job) == 1
        if result.state("big-b") != "QUEUED":
            break
        assert not frank_jobs(dash, "big-b")
        assert "GPU" in result.obj("big-b")["reason"]
        waiting += 1
        assert waiting < 60, "big-b queued for too long"
        time.sleep(1)
    assert waiting >= 2, "big-b should have been queued while big-a ran"
    a_final = job_by_id(dash, a_job[0]["submission_id"])
    assert a_final["status"] == "SUCCEEDED", a_final

    done = reconcile_until(env, lambda r: r.state("big-b") in FINAL, "big-b finished", timeout=90)
    assert done.state("big-b") == "SUCCEEDED", done.obj("big-b")
    (b_job,) = frank_jobs(dash, "big-b")
    assert b_job["start_time"] >= a_final["end_time"], "big-b must start after big-a ended"


def test_a_task_larger_than_the_cluster_blocks_nobody(env: Env) -> None:
    """A 4-GPU task on the 2-GPU cluster can never run: it is UNSCHEDULABLE (never submitted) and
    another user's later 1-GPU task runs at once (issue 10: no head-of-line blocking)."""
    repo, dash = env.repo, env.dash
    wait_gpus_free(env)
    repo.write(task_path("huge"), task_yaml("sleep 1", gpus=4))
    repo.commit_push("frank: a task larger than the cluster")
    other = "users/grace/tasks/small.yaml"
    repo.write(other, task_yaml("echo small-ran", gpus=1))
    repo.commit_push("grace: a small task, committed later")
    try:
        first = reconcile(env)
        assert first.rc == 0, (first.out, first.stderr)
        huge = first.obj("huge")
        assert (huge["state"], huge["submission_id"]) == ("UNSCHEDULABLE", None), huge
        assert "needs 4 GPU, 1 worker_node but the whole cluster has 2 GPU" in huge["reason"], huge
        small = next(o for o in first.out["objects"] if o["object"] == "grace/tasks/small")
        assert small["state"] == "SUBMITTED", why(first, "huge") + f"; small: {small.get('reason')!r}"
        wait_job(dash, str(small["submission_id"]), {"SUCCEEDED"})
        again = reconcile(env)
        assert again.state("huge") == "UNSCHEDULABLE"
        ids = [str(j.get("submission_id")) for j in dash.get("/api/jobs/")]
        assert not [i for i in ids if "frank" in i and "huge" in i], ids  # never submitted
    finally:
        repo.remove(task_path("huge"))
        repo.remove(other)
        repo.commit_push("remove the unschedulable scenario's tasks")


# -- 3. exactly once ---------------------------------------------------------------------------


def test_exactly_one_job_per_spec_hash(env: Env) -> None:
    """Repeated reconciles, each a fresh process, some concurrent: one Ray job per spec hash."""
    repo, dash = env.repo, env.dash
    wait_gpus_free(env)
    repo.write(task_path("once"), task_yaml("sleep 3"))
    repo.commit_push("frank: once")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler.cli",
                "reconcile",
                "--once",
                "--repo",
                str(repo.bare),
                "--ray",
                env.head.dashboard_url,
                "--format",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO_ROOT,
            # The same state folder (ownership key) as every other reconcile of this module: a
            # process with another key rightly sees these jobs as foreign.
            env={**os.environ, "ARGUS_CACHE_DIR": str(env.root / "cache")},
        )
        for _ in range(3)
    ]
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert len(frank_jobs(dash, "once")) == 1, [o.decode(errors="replace")[-2000:] for o in outs]
    for _ in range(3):
        reconcile(env)
    reconcile_until(env, lambda r: r.state("once") == "SUCCEEDED", "once SUCCEEDED", timeout=60)
    for _ in range(2):
        after = reconcile(env)
        assert after.rc == 0 and after.state("once") == "SUCCEEDED"
        assert not after.out["plan"]["actions"] or all(
            a.get("action") != "submit_task" for a in after.out["plan"]["actions"]
        ), after.out["plan"]
    by_hash: dict[str, int] = {}
    for job in frank_jobs(dash):
        digest = (job.get("metadata") or {}).get("argus-spec-hash", "")
        by_hash[digest] = by_hash.get(digest, 0) + 1
    jobs = sorted(
        (j["submission_id"], j.get("status"), (j.get("metadata") or {}).get("argus-spec-hash"))
        for j in frank_jobs(dash)
    )
    assert by_hash and all(n == 1 for n in by_hash.values()), (by_hash, jobs)
    assert len(frank_jobs(dash, "once")) == 1


# -- 4. change and delete ----------------------------------------------------------------------


def test_changing_a_running_task_restarts_it_and_deleting_it_stops_it(env: Env) -> None:
    repo, dash = env.repo, env.dash
    wait_gpus_free(env)
    repo.write(task_path("long"), task_yaml("sleep 300"))
    repo.commit_push("frank: long")
    running = reconcile_until(env, lambda r: r.state("long") == "RUNNING", "long RUNNING", timeout=60)
    old = running.obj("long")["submission_id"]

    repo.write(task_path("long"), task_yaml("sleep 300", run=2))
    repo.commit_push("frank: run long again")
    changed = reconcile(env)
    assert changed.rc == 0, (changed.out, changed.stderr)
    new = changed.obj("long")["submission_id"]
    assert new != old and new.startswith(f"argus--{USER}--long--")
    types = {(a["action"], a.get("submission_id")) for a in changed.out["plan"]["actions"]}
    assert ("stop_task", old) in types and ("submit_task", new) in types, changed.out["plan"]
    assert wait_job(dash, old, FINAL)["status"] == "STOPPED"
    reconcile_until(env, lambda r: r.state("long") == "RUNNING", "the new run RUNNING", timeout=60)
    assert {j["submission_id"] for j in frank_jobs(dash, "long")} == {old, new}

    repo.remove(task_path("long"))
    repo.commit_push("frank: delete long")
    gone = reconcile(env)
    assert gone.rc == 0, (gone.out, gone.stderr)
    assert ("stop_task", new) in {(a["action"], a.get("submission_id")) for a in gone.out["plan"]["actions"]}
    assert wait_job(dash, new, FINAL)["status"] == "STOPPED"
    final = reconcile_until(env, lambda r: not r.obj("long"), "long gone from the objects")
    assert not [a for a in final.out["plan"]["actions"] if "long" in a.get("object", "")]
    assert len(frank_jobs(dash, "long")) == 2


# -- 5. failure --------------------------------------------------------------------------------


def test_failing_command_is_failed_with_message_and_log_tail(env: Env) -> None:
    repo, dash = env.repo, env.dash
    command = f"{PY} -c " + shlex.quote("import sys; print('boom-marker'); sys.exit(3)")
    wait_gpus_free(env)
    repo.write(task_path("boom"), task_yaml(command))
    repo.commit_push("frank: boom")
    failed = reconcile_until(env, lambda r: r.state("boom") in FINAL, "boom finished", timeout=60)
    obj = failed.obj("boom")
    assert obj["state"] == "FAILED", obj
    assert "exit code 3" in obj["reason"], obj
    (run,) = obj["runs"]
    assert run["status"] == "FAILED" and run["submission_id"] == obj["submission_id"]
    assert "exit code 3" in run["message"]
    assert "boom-marker" in run["log_tail"], run
    for _ in range(2):
        again = reconcile(env)
        assert again.state("boom") == "FAILED"
    assert len(frank_jobs(dash, "boom")) == 1, "a FAILED run is never resubmitted"


# -- 6. verl override check ----------------------------------------------------------------------


def test_typo_in_a_verl_override_is_rejected_and_never_submitted(env: Env) -> None:
    repo, dash = env.repo, env.dash
    data = env.users / USER / "data" / "train.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"PAR1")
    text = (
        "kind: Task\n"
        "workload: grpo\n"
        f"model: {env.tiny_llama}\n"
        "data:\n"
        f"  train: {data}\n"
        "gpus_per_node: 1\n"
        "overrides:\n"
        "  - data.train_batch_size=8\n"
        "  - actor_rollout_ref.rollout.nme=vllm\n"
    )
    line = text.splitlines().index("  - actor_rollout_ref.rollout.nme=vllm") + 1
    repo.write(task_path("grpo"), text)

    proc = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "validate", str(repo.work)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    where = f"{task_path('grpo')}:{line}: "
    assert any(ln.startswith(where) and "nme" in ln for ln in proc.stderr.splitlines()), proc.stderr

    repo.commit_push("frank: grpo with a typo")
    result = reconcile(env)
    assert result.rc == 1
    errors = [e for e in result.out["errors"] if e["path"] == task_path("grpo")]
    assert errors and errors[0]["line"] == line and "nme" in errors[0]["message"], result.out["errors"]
    assert result.state("grpo") == "INVALID"
    assert result.obj("grpo")["sync"] == "Invalid"
    assert not any(a["action"] == "submit_task" for a in result.out["plan"]["actions"])
    time.sleep(1)
    assert not frank_jobs(dash, "grpo")
    repo.remove(task_path("grpo"))
    repo.commit_push("frank: drop the broken grpo task")


# -- 1, continued: the trained model answers ----------------------------------------------------


def test_trained_model_answers_last(env: Env) -> None:
    """The model deployed from the fine-tune's checkpoint reaches RUNNING and answers a chat
    request through the official OpenAI client (base_url = the Serve proxy's /v1)."""
    if "checkpoint" not in TRAINED:
        pytest.fail("the fine-tune scenario did not produce a checkpoint to serve (see its failure)")
    dash = env.dash
    live = reconcile_until(
        env,
        lambda r: r.state("tuned", "model") == "RUNNING" and r.obj("tuned", "model")["replicas"]["ready"] == 1,
        "the trained model RUNNING",
        timeout=240,
        every=3,
    )
    served = live.obj("tuned", "model")["served_name"]
    assert served.startswith(f"{USER}-") and served.endswith("-tuned")
    app = observe_serve(dash).apps[f"argus--{USER}--tuned"]
    assert TRAINED["checkpoint"] in json.dumps(app)
    assert len(frank_jobs(dash, "tune")) == 1

    import openai

    client = openai.OpenAI(base_url=env.head.serve_url + "/v1", api_key="none", max_retries=0, timeout=60)
    deadline = time.monotonic() + 60
    while served not in [m.id for m in client.models.list().data]:
        assert time.monotonic() < deadline, "the router never listed the trained model"
        time.sleep(1)
    reply = client.chat.completions.create(
        model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None and reply.usage.completion_tokens > 0
