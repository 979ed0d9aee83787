"""Nothing runs twice, even when Ray forgets (issue 9 §2), on a real Ray head of its own.

The head is stopped (every process of it) and a new, empty head is started on the same ports:
what a head restart without GCS fault tolerance looks like. The status branch is argus's durable
record of runs: a finished task is not submitted again, whether the daemon kept running or was
restarted too; a run the head forgot while it was in flight is LOST until ``run:`` is bumped; and
the crash windows (kill -9 right after a submit, and while a status commit is being written) end
with exactly one Ray job per spec. A model is redeployed on the new head (models are idempotent).

Tests run in file order and share one head, one repository and one daemon history.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead, restart_head, start_head
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, cluster_yaml, model_yaml, wait_for

pytestmark = pytest.mark.e2e

DONE = "users/dave/tasks/done.yaml"
INFLIGHT = "users/dave/tasks/inflight.yaml"
MIDCOMMIT = "users/dave/tasks/midcommit.yaml"
MODEL = "users/dave/models/chat.yaml"


@dataclass
class Env:
    root: Path
    repo: ConfigRepo
    head: RayHead
    daemon: DaemonProc

    @property
    def dash(self) -> Dashboard:
        return Dashboard(self.head.dashboard_url, timeout=10)

    def restart_head(self) -> None:
        self.head = restart_head(self.head)
        self.daemon.head = self.head  # same ports: the daemon's URLs stay valid


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, hf_cache: Path) -> Iterator[Env]:
    require("ray", "ray.serve")
    from tests.conftest import REPO_ROOT

    head = start_head(
        num_cpus=4,
        num_gpus=1,
        resources={"worker_node": 2},
        env={"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    root = tmp_path_factory.mktemp("restart")
    (root / "users" / "dave").mkdir(parents=True)
    repo = ConfigRepo(root)
    repo.write("cluster.yaml", cluster_yaml(hf_cache, root / "users", head.serve_port))
    state = Env(root, repo, head, DaemonProc(repo, head, root))
    state.daemon.start()
    try:
        yield state
    finally:
        state.daemon.stop()
        state.head.stop()
        shutil.rmtree(state.head.temp_dir, ignore_errors=True)


def doc(env: Env, path: str) -> dict[str, Any]:
    return read_documents(str(env.repo.bare), "argus/status").get(path) or {}


def jobs_of(env: Env, task: str) -> list[dict[str, Any]]:
    prefix = f"argus--dave--{task}--"
    return [j for j in env.dash.get("/api/jobs/") if str(j.get("submission_id", "")).startswith(prefix)]


def task_yaml(run: int = 1) -> dict[str, Any]:
    return {"kind": "Task", "workload": "command", "command": "echo done", "gpus_per_node": 1, "run": run}


def ticks(env: Env, n: int = 4) -> None:
    """Let the daemon (observe interval 1 s) run a few ticks against the current head."""
    time.sleep(n + 1)


def test_finished_task_is_not_resubmitted_after_a_head_restart(env: Env) -> None:
    env.repo.write(DONE, task_yaml())
    env.repo.commit_push("dave: a task")
    wait_for(lambda: doc(env, DONE).get("state") == "SUCCEEDED", "task SUCCEEDED", timeout=90)
    run = doc(env, DONE)["runs"]
    assert len(run) == 1 and run[0]["status"] == "SUCCEEDED" and run[0]["spec_hash"]
    started = time.monotonic()
    env.restart_head()
    print(f"head restarted in {time.monotonic() - started:.1f} s")
    assert jobs_of(env, "done") == []  # the new head knows nothing
    ticks(env)  # the daemon kept running through the restart
    assert jobs_of(env, "done") == []
    assert doc(env, DONE)["state"] == "SUCCEEDED" and doc(env, DONE)["runs"] == run
    env.daemon.stop()
    env.daemon.start()  # and a restarted daemon reads the record from the status branch
    ticks(env)
    assert jobs_of(env, "done") == []
    assert doc(env, DONE)["state"] == "SUCCEEDED" and doc(env, DONE)["runs"] == run


def test_kill9_after_submit_then_head_restart_is_lost_not_resubmitted(env: Env) -> None:
    """The worst window: the job exists only in Ray (the tick's status write never happened) and
    Ray forgets it. The run was recorded before it was submitted, so it is LOST, not run again."""
    env.daemon.stop()
    env.daemon.start(fault="after_submit")
    env.repo.write(INFLIGHT, {**task_yaml(), "command": "sleep 600"})
    env.repo.commit_push("dave: a long task")
    assert env.daemon.wait_killed(timeout=60) == -signal.SIGKILL
    assert len(jobs_of(env, "inflight")) == 1
    recorded = doc(env, INFLIGHT)["runs"]
    assert [r["status"] for r in recorded] == ["SUBMITTED"]
    env.restart_head()
    env.daemon.start()
    wait_for(lambda: doc(env, INFLIGHT).get("state") == "LOST", "task LOST", timeout=60)
    assert doc(env, INFLIGHT)["reason"] == "the Ray head restarted while it ran"
    ticks(env)
    assert jobs_of(env, "inflight") == []  # exactly one job for this spec, ever (on the old head)
    env.repo.write(INFLIGHT, {**task_yaml(run=2), "command": "sleep 1"})
    env.repo.commit_push("dave: run it again")
    wait_for(lambda: doc(env, INFLIGHT).get("state") == "SUCCEEDED", "bumped run SUCCEEDED", timeout=90)
    assert len(jobs_of(env, "inflight")) == 1
    assert [r["status"] for r in doc(env, INFLIGHT)["runs"]] == ["LOST", "SUCCEEDED"]


def test_kill9_during_a_status_commit_submits_exactly_once(env: Env) -> None:
    env.daemon.stop()
    env.daemon.start(fault="status_commit")
    env.repo.write(MIDCOMMIT, task_yaml())
    env.repo.commit_push("dave: another task")
    assert env.daemon.wait_killed(timeout=60) == -signal.SIGKILL
    assert len(jobs_of(env, "midcommit")) <= 1
    env.daemon.start()
    wait_for(lambda: doc(env, MIDCOMMIT).get("state") == "SUCCEEDED", "task SUCCEEDED", timeout=90)
    ticks(env)
    assert len(jobs_of(env, "midcommit")) == 1
    assert [r["status"] for r in doc(env, MIDCOMMIT)["runs"]] == ["SUCCEEDED"]


def test_a_model_is_redeployed_on_the_new_head(env: Env, tiny_llama: Path) -> None:
    env.repo.write(MODEL, model_yaml("argus-test/tiny-llama"))
    env.repo.commit_push("dave: a model")
    wait_for(lambda: doc(env, MODEL).get("state") == "RUNNING", "model RUNNING", timeout=300, every=2)
    env.restart_head()
    wait_for(lambda: doc(env, MODEL).get("state") == "RUNNING" and _app_running(env), "model back", timeout=300)
    assert jobs_of(env, "done") == []


def _app_running(env: Env) -> bool:
    try:
        apps = env.dash.get("/api/serve/applications/").get("applications") or {}
    except Exception:
        return False
    return (apps.get("argus--dave--chat") or {}).get("status") == "RUNNING"
