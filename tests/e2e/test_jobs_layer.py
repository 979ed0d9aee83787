"""The Ray Jobs layer against a real Ray head (no mocks): builder -> submit -> observe -> stop.

It uses the session's shared head (``ray_head`` in tests/conftest.py), which declares 2 logical
GPUs and 4 ``worker_node`` units on this CPU machine, so Ray's own admission (a 2-GPU job waits
while another holds both GPUs) is observable here.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

from reconciler.apply.jobs import stop_job, submit_job
from reconciler.builders.jobs import job_submission, ownership_proof, run_dir
from reconciler.dashboard import Dashboard
from reconciler.errors import ApplyFailed
from reconciler.observe.jobs import find_hf_checkpoint, job_log_tail, observe_jobs
from reconciler.plan.actual import ActualJob
from reconciler.plan.demand import task_resources
from reconciler.spec.hashing import submission_id, task_spec_hash
from reconciler.spec.types import ClusterSpec, ObjectKey, Paths, TaskSpec, Training
from reconciler.testing.ray_head import RayHead
from tests.support import task_spec

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
KEY = b"test-ownership-key-0123456789abcdef"  # this module's daemon key
PY = shlex.quote(sys.executable)


@pytest.fixture(scope="module")
def dash(ray_head: RayHead) -> Dashboard:
    """The session's shared head (tests/conftest.py): 2 logical GPUs, 4 ``worker_node`` units."""
    return Dashboard(ray_head.dashboard_url)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> ClusterSpec:
    users = tmp_path_factory.mktemp("users")
    return ClusterSpec(
        paths=Paths(common=str(tmp_path_factory.mktemp("hf")), users=str(users)),
        training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
        env={"HF_HUB_OFFLINE": "1"},
    )


def command_task(name: str, command: str, *, gpus: int = 0, working_dir: str | None = None, run: int = 1) -> TaskSpec:
    return task_spec(
        "alice", name, command=command, gpus_per_node=gpus, working_dir=working_dir, run=run, env={"ARGUS_TEST": "1"}
    )


def job(dash: Dashboard, sid: str, paths: Paths | None = None) -> ActualJob | None:
    return next((j for j in observe_jobs(dash, KEY, paths) if j.submission_id == sid), None)


def wait_status(
    dash: Dashboard, sid: str, states: set[str], timeout: float = 120.0, paths: Paths | None = None
) -> ActualJob:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = job(dash, sid, paths)
        if last is not None and last.status in states:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{sid} did not reach {states}: {last}")


def submit(dash: Dashboard, task: TaskSpec, cluster: ClusterSpec) -> str:
    return submit_job(
        dash, job_submission(task, cluster, revision="rev1", secrets_env={"SECRET_X": "s"}, ownership_key=KEY)
    )


def test_command_succeeds_and_is_observed(dash: Dashboard, cluster: ClusterSpec) -> None:
    task = command_task(
        "ok", f"{PY} -c \"import os; print('hello', os.environ['ARGUS_TEST'], os.environ['SECRET_X'])\""
    )
    sid = submit(dash, task, cluster)
    assert sid == submission_id(task)
    done = wait_status(dash, sid, {"SUCCEEDED", "FAILED"})
    assert done.status == "SUCCEEDED", job_log_tail(dash, sid)
    assert done.key == ObjectKey("alice", "task", "ok")
    assert done.spec_hash == task_spec_hash(task)
    assert done.revision == "rev1"
    assert done.resources == {"worker_node": 1.0}
    assert done.hf_checkpoint is None
    assert "hello 1 s" in job_log_tail(dash, sid)


def test_duplicate_submit_is_one_job(dash: Dashboard, cluster: ClusterSpec) -> None:
    task = command_task("dup", f"{PY} -c 'print(1)'")
    body = job_submission(task, cluster, revision=None, secrets_env={}, ownership_key=KEY)
    assert submit_job(dash, body) == body["submission_id"]
    assert submit_job(dash, body) == body["submission_id"]  # Ray: HTTP 500 "already exists" -> fine
    assert submit_job(dash, body) == body["submission_id"]
    all_jobs = dash.get("/api/jobs/")
    assert sum(1 for j in all_jobs if j.get("submission_id") == body["submission_id"]) == 1
    wait_status(dash, body["submission_id"], {"SUCCEEDED"})


def test_failing_command_reports_log(dash: Dashboard, cluster: ClusterSpec) -> None:
    task = command_task("fail", f"{PY} -c \"import sys; print('argus-boom-marker', file=sys.stderr); sys.exit(3)\"")
    sid = submit(dash, task, cluster)
    done = wait_status(dash, sid, {"SUCCEEDED", "FAILED"})
    assert done.status == "FAILED"
    assert done.message  # Ray's explanation (exit code)
    assert any("argus-boom-marker" in line for line in job_log_tail(dash, sid, lines=20))


def test_stop_sleeping_job(dash: Dashboard, cluster: ClusterSpec) -> None:
    task = command_task("sleepy", "sleep 600")
    sid = submit(dash, task, cluster)
    wait_status(dash, sid, {"RUNNING"})
    assert stop_job(dash, sid) is True
    assert wait_status(dash, sid, {"STOPPED", "FAILED", "SUCCEEDED"}, timeout=60).status == "STOPPED"
    assert stop_job(dash, sid) is False  # already final: a no-op
    assert stop_job(dash, "argus-alice-nosuchjob-00000000") is False


def test_gpu_admission_by_ray(dash: Dashboard, cluster: ClusterSpec) -> None:
    """Two 2-GPU jobs on a 2-GPU cluster: Ray keeps the second PENDING until the first ends."""
    first = command_task("gpu-a", "sleep 600", gpus=2)
    second = command_task(
        "gpu-b", f"{PY} -c \"import os; print('gpus', os.environ.get('CUDA_VISIBLE_DEVICES'))\"", gpus=2
    )
    sid_a = submit(dash, first, cluster)
    running = wait_status(dash, sid_a, {"RUNNING"})
    assert running.resources == {"worker_node": 1.0, "GPU": 2.0} == task_resources(first, cluster)
    sid_b = submit(dash, second, cluster)
    time.sleep(6)  # long enough for Ray to have started it, were the GPUs free
    waiting = job(dash, sid_b)
    assert waiting is not None and waiting.status == "PENDING"
    assert waiting.active and waiting.committed() == {"worker_node": 1.0, "GPU": 2.0}
    assert job(dash, sid_a).status == "RUNNING"  # type: ignore[union-attr]
    stop_job(dash, sid_a)
    assert wait_status(dash, sid_b, {"SUCCEEDED", "FAILED"}, timeout=120).status == "SUCCEEDED"
    assert any(line.startswith("gpus ") for line in job_log_tail(dash, sid_b))


def test_non_argus_jobs_are_ignored(dash: Dashboard) -> None:
    dash.post("/api/jobs/", {"entrypoint": "true", "submission_id": "not-argus-1", "metadata": {"owner": "bob"}})
    assert all(j.submission_id != "not-argus-1" for j in observe_jobs(dash, KEY))


def test_invalid_request_is_permanent(dash: Dashboard, cluster: ClusterSpec) -> None:
    body = job_submission(command_task("badreq", "true"), cluster, revision=None, secrets_env={}, ownership_key=KEY)
    body["entrypoint_num_gpus"] = "two"
    with pytest.raises(ApplyFailed) as err:
        submit_job(dash, body)
    assert err.value.permanent


def test_bad_runtime_env_fails_the_job_not_the_submit(dash: Dashboard, cluster: ClusterSpec) -> None:
    """Ray 2.60 accepts the submission and fails the job: the error surfaces as FAILED + message."""
    body = job_submission(command_task("badenv", "true"), cluster, revision=None, secrets_env={}, ownership_key=KEY)
    body["runtime_env"]["pip"] = 5  # not a list or a requirements file
    body["metadata"]["argus-proof"] = ownership_proof(KEY, body["submission_id"], body)  # what runs changed
    sid = submit_job(dash, body)
    done = wait_status(dash, sid, {"FAILED", "SUCCEEDED"}, timeout=60)
    assert done.status == "FAILED" and "pip" in done.message


def test_unreachable_dashboard_is_temporary() -> None:
    from reconciler.testing.ray_head import free_port

    with pytest.raises(ApplyFailed) as err:
        submit_job(
            Dashboard(f"http://127.0.0.1:{free_port()}", timeout=2), {"submission_id": "x", "entrypoint": "true"}
        )
    assert not err.value.permanent


def test_cpu_finetune_writes_servable_checkpoint(dash: Dashboard, cluster: ClusterSpec, tmp_path_factory) -> None:
    """A real (tiny) fine-tune as a command task; its HF folder is found from the job's labels."""
    from reconciler.testing.tiny_model import generate_tiny_llama

    base = generate_tiny_llama(tmp_path_factory.mktemp("tinycache"))
    task = command_task(
        "finetune",
        f"{PY} -m reconciler.testing.finetune_tiny {shlex.quote(str(base))} --steps 3",
        working_dir=str(REPO),  # local:// working dir: used in place, makes the package importable
    )
    sid = submit(dash, task, cluster)
    done = wait_status(dash, sid, {"SUCCEEDED", "FAILED"}, timeout=240, paths=cluster.paths)
    assert done.status == "SUCCEEDED", "\n".join(job_log_tail(dash, sid))
    expected = Path(run_dir(task, cluster)) / "checkpoints" / "final"
    assert done.hf_checkpoint == str(expected)
    assert find_hf_checkpoint(run_dir(task, cluster)) == str(expected)
    assert (expected / "config.json").is_file() and (expected / "model.safetensors").is_file()
    assert any("step 3/3 loss" in line for line in job_log_tail(dash, sid))

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(expected)  # loadable: servable


def test_find_hf_checkpoint_prefers_highest_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (2, 10, 9):
        hf = run / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
        (hf / "model.safetensors").write_bytes(b"x")
        # verl's sharded checkpoint next to it is not an HF folder
        (hf.parent / "model_world_size_1_rank_0.pt").write_bytes(b"x")
    (run / "checkpoints" / "global_step_11" / "actor" / "huggingface").mkdir(parents=True)  # config only
    (run / "checkpoints" / "global_step_11" / "actor" / "huggingface" / "config.json").write_text("{}")
    assert find_hf_checkpoint(str(run)) == str(run / "checkpoints" / "global_step_10" / "actor" / "huggingface")
    assert find_hf_checkpoint(str(tmp_path / "missing")) is None


def test_forged_job_is_foreign_and_feeds_no_model(dash: Dashboard, cluster: ClusterSpec, tmp_path: Path) -> None:
    """Issue 10 §3 on a real head: a job submitted straight to the Jobs API, labelled as alice's task
    (``managed-by: argus``, her user and task, the spec hash, her next submission id) with its run
    folder in bob's home holding a servable checkpoint. It is foreign: not a run of alice's task
    (which runs under a fresh id) and never the source of alice's ``task:`` model."""
    from reconciler.plan.actions import ActionType
    from reconciler.source.localfs import LocalFS
    from reconciler.source.remote import open_source
    from tests.support import ConfigRepo, cluster_yaml, ticker

    users = Path(cluster.paths.users)
    stolen = users / "bob" / "jobs" / "x" / "checkpoints" / "final"
    stolen.mkdir(parents=True)
    (stolen / "config.json").write_text("{}")
    (stolen / "model.safetensors").write_bytes(b"x")
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(Path(cluster.paths.common), users, 8000))
    repo.write("users/alice/tasks/forged.yaml", {"kind": "Task", "workload": "command", "command": "true"})
    repo.write("users/alice/models/chat.yaml", {"kind": "Model", "source": "task:forged"})
    repo.commit_push("alice: a task and its model")
    reconciler = ticker(
        open_source(str(repo.bare), str(tmp_path / "cache")), "main", dash, ownership_key=KEY, fs=LocalFS()
    )
    desired = reconciler.parts.revisions.read().desired
    task = desired.tasks[ObjectKey("alice", "task", "forged")]
    sid = submission_id(task)
    forged_meta = {
        "managed-by": "argus",
        "argus-user": "alice",
        "argus-task": "forged",
        "argus-spec-hash": task_spec_hash(task),
        "argus-run-dir": str(stolen.parent.parent),
        "argus-proof": "0" * 64,
    }
    dash.post("/api/jobs/", {"entrypoint": "true", "submission_id": sid, "metadata": forged_meta})
    wait_for_raw = time.monotonic() + 60
    while next(j for j in dash.get("/api/jobs/") if j["submission_id"] == sid)["status"] != "SUCCEEDED":
        assert time.monotonic() < wait_for_raw, "forged job did not finish"
        time.sleep(0.5)

    result = reconciler.tick()
    assert all(j.submission_id != sid for j in result.actual.jobs)  # never adopted
    assert sid in result.actual.foreign_ids
    assert any(sid in note and "ownership proof" in note for note in result.notes)  # reported
    # Not considered run: alice's run is planned (admitted, or queued behind the module's other
    # jobs) under a fresh id, since the forged job holds the first one.
    (action,) = result.plan.for_key(task.key)
    assert action.type in (ActionType.SUBMIT_TASK, ActionType.QUEUE), action
    assert action.submission_id == submission_id(task, 2)
    model_actions = result.plan.for_key(ObjectKey("alice", "model", "chat"))
    assert [a.type for a in model_actions] == [ActionType.QUEUE]  # waits for alice's own run
    deadline = time.monotonic() + 120
    while job(dash, submission_id(task, 2)) is None:
        assert time.monotonic() < deadline, "alice's own run was never submitted"
        time.sleep(1)
        reconciler.tick()
    fresh = wait_status(dash, submission_id(task, 2), {"SUCCEEDED", "FAILED"}, paths=cluster.paths)
    assert fresh.status == "SUCCEEDED" and fresh.hf_checkpoint is None
    again = reconciler.tick()
    assert not any(a.type is ActionType.DEPLOY_MODEL for a in again.plan.actions)  # bob's folder is never served
    assert not any(a.type is ActionType.SUBMIT_TASK for a in again.plan.actions)  # alice's run counts, once


def test_a_resubmitted_job_with_copied_labels_is_foreign(dash: Dashboard, cluster: ClusterSpec, tmp_path: Path) -> None:
    """Job code holding the Ray token deletes argus's finished job and resubmits its id with the
    labels (and proof) copied, running something else: foreign. Resubmitting exactly what argus
    submitted (entrypoint and runtime environment included) stays argus's run: it runs nothing
    argus would not have run."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text("print('argus ran me')\n")
    task = command_task("copied", f"{PY} job.py", working_dir=str(code))
    sid = submit(dash, task, cluster)
    original = wait_status(dash, sid, {"SUCCEEDED", "FAILED"})
    assert original.status == "SUCCEEDED", job_log_tail(dash, sid)  # Ray's JobDetails round-trip the proof
    details = dash.get(f"/api/jobs/{sid}")
    submitted = {
        k: details[k]
        for k in ("entrypoint", "runtime_env", "entrypoint_num_gpus", "entrypoint_resources", "metadata")
        if details.get(k) is not None
    }

    def resubmit(**changes: object) -> None:
        dash.delete(f"/api/jobs/{sid}")
        dash.post("/api/jobs/", {**submitted, **changes, "submission_id": sid})
        deadline = time.monotonic() + 60
        while dash.get(f"/api/jobs/{sid}").get("status") not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, "the resubmitted job did not finish"
            time.sleep(0.5)

    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "job.py").write_text("print('mallory ran me')\n")
    env = dict(submitted["runtime_env"])
    for changes in (
        {"entrypoint": f"{PY} -c \"print('mallory ran me')\""},
        {"runtime_env": {**env, "working_dir": f"local://{evil}"}},
        {"runtime_env": {**env, "env_vars": {**env.get("env_vars", {}), "PYTHONSTARTUP": str(evil / "job.py")}}},
    ):
        resubmit(**changes)
        assert job(dash, sid) is None, f"a job with copied labels and {changes} was adopted"
    resubmit()  # exactly as argus submitted it
    assert job(dash, sid) is not None
