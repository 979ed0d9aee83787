"""Nothing in a job's HOME (the user's upload folder) runs by itself (issue 31 item 6): the built runtime env.

The job-level proof (an uploaded ``.pth`` and ``usercustomize`` in HOME, run by a real Ray job) is
``tests/e2e/test_job_home.py``; these check every body argus builds, for every workload and attempt.
"""

from __future__ import annotations

import hashlib
import posixpath

import pytest

from reconciler.builders.isolation import JOB_CACHE_ROOT, isolation_env
from reconciler.builders.jobs import job_submission
from reconciler.builders.resolved import resolved_spec
from reconciler.spec.hashing import task_spec_hash
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import ClusterSpec, DesiredState, Paths, TaskSpec, Training
from tests.support import task_spec

CLUSTER = ClusterSpec(
    paths=Paths(common="/shared/hf", users="/shared/users"),
    training=Training(rollout="vllm", driver_resources={"worker_node": 1.0}),
    env={"HF_HUB_OFFLINE": "1"},
)
TRAINER = {
    "model": "Qwen/Qwen2.5-0.5B",
    "model_path": "/shared/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc",
    "data_train": "/shared/users/alice/data/train.parquet",
}
WORKLOADS = ("sft", "ppo", "grpo", "command")


def task(workload: str, **kw: object) -> TaskSpec:
    fields = dict(TRAINER) if workload != "command" else {"command": "python3 train.py"}
    fields.update(kw)
    return task_spec("alice", f"t-{workload}", workload, **fields)


def env_of(workload: str, cluster: ClusterSpec = CLUSTER, **kw: object) -> dict[str, str]:
    body = job_submission(task(workload, **kw), cluster, revision=None, secrets_env={})
    return dict(body["runtime_env"]["env_vars"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_job_runs_without_the_user_site_and_keeps_caches_out_of_home(workload: str) -> None:
    env = env_of(workload)
    assert env["HOME"] == "/shared/users/alice"
    assert env["PYTHONNOUSERSITE"] == "1"
    moved = {k: v for k, v in env.items() if k in isolation_env(task(workload)) and k != "PYTHONNOUSERSITE"}
    assert set(moved) >= {"XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "WANDB_CONFIG_DIR"}
    for name, value in moved.items():
        # Nowhere under any user's folder: not alice's (her uploads), not another user's.
        assert not value.startswith("/shared/users"), (name, value)
        assert value == "/dev/null" or posixpath.commonpath([value, JOB_CACHE_ROOT]) == JOB_CACHE_ROOT, (name, value)
    assert all(v.startswith(f"{JOB_CACHE_ROOT}/alice") or v == "/dev/null" for v in moved.values())


def test_a_resumed_attempt_is_isolated_too() -> None:
    body = job_submission(task("grpo"), CLUSTER, revision=None, secrets_env={}, resume_from="argus--alice--x--1")
    assert body["runtime_env"]["env_vars"]["PYTHONNOUSERSITE"] == "1"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_user_site_true_opts_in(workload: str) -> None:
    env = env_of(workload, user_site=True)
    assert "PYTHONNOUSERSITE" not in env
    assert env["XDG_CACHE_HOME"] == f"{JOB_CACHE_ROOT}/alice/cache"  # only the user site: caches stay out of HOME


def test_an_explicit_env_wins_over_the_defaults_and_home_still_wins_over_it() -> None:
    cluster = ClusterSpec(paths=CLUSTER.paths, training=CLUSTER.training, env={"XDG_CACHE_HOME": "/scratch/cache"})
    assert env_of("grpo", cluster)["XDG_CACHE_HOME"] == "/scratch/cache"  # an admin's place for caches
    env = env_of("command", env={"TRITON_CACHE_DIR": "/shared/users/alice/triton"})
    assert env["TRITON_CACHE_DIR"] == "/shared/users/alice/triton"  # the task file says so, visibly
    assert env["HOME"] == "/shared/users/alice" and env["PYTHONNOUSERSITE"] == "1"


def test_render_and_the_status_show_the_env_the_job_gets() -> None:
    spec = task("sft")
    shown = resolved_spec(spec, CLUSTER, secret_names=("HF_TOKEN",))["env"]
    built = env_of("sft")
    assert shown == {**built, "HF_TOKEN": "(from the daemon's environment)"}
    assert shown["HOME"] == "/shared/users/alice" and shown["PYTHONNOUSERSITE"] == "1"


def _load_task(text: str) -> DesiredState:
    data = text.encode()
    files = [
        SourceFile("cluster.yaml", b"kind: Cluster\n", "c"),
        SourceFile("users/alice/tasks/t.yaml", data, hashlib.sha1(data).hexdigest()),
    ]
    return load(files)


def test_the_task_key_loads_and_hashes() -> None:
    base = "kind: Task\nworkload: command\ncommand: python3 x.py\n"
    plain = _load_task(base)
    off = _load_task(base + "user_site: false\n")
    on = _load_task(base + "user_site: true\n")
    (plain_task,), (off_task,), (on_task,) = (list(s.tasks.values()) for s in (plain, off, on))
    assert not plain_task.user_site and not off_task.user_site and on_task.user_site
    # `false` is the default: no new run; `true` changes what runs: a new run.
    assert task_spec_hash(off_task) == task_spec_hash(plain_task) != task_spec_hash(on_task)
    bad = _load_task(base + "user_site: yes please\n")
    assert not bad.tasks
    assert any(i.line == 4 and "user_site" in i.message for i in bad.issues), bad.issues
