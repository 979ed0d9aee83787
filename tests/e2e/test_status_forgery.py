"""argus's own records, forged from the repository, change nothing that runs (issue 18, item 1).

A real Ray head, the real ``Daemon`` (its tick parts, ``StatusWriter``, ``Lease``) driven tick
by tick, and a plain ``file://`` remote: a bare repository without hooks, which accepts any
push from anyone. An ordinary user (vera) pushes what the review did: a status commit recording
another user's (wade's) task SUCCEEDED before it ran, a ``first_seen`` that puts her task first
in the queue, a lease with a far-future expiry, and a deleted status branch. Each changes
nothing that runs, and each is reported (the status README on the remote and ``/healthz``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.apply.jobs import stop_job
from reconciler.daemon import build_parts
from reconciler.dashboard import Dashboard
from reconciler.loop import Daemon
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.spec.hashing import submission_id, task_spec_hash
from reconciler.spec.types import ObjectKey
from reconciler.status.branch import read_documents
from reconciler.status.lease import LEASE_REF, Lease
from reconciler.status.writer import StatusWriter
from reconciler.testing.ray_head import RayHead
from tests.support import ConfigRepo, cluster_yaml, git, wait_for

pytestmark = pytest.mark.e2e

STATUS = "argus/status"
ACTIVE = {"PENDING", "RUNNING"}


@dataclass
class Env:
    repo: ConfigRepo
    url: str
    dash: Dashboard
    root: Path
    daemon: Daemon | None = None

    def start(self) -> Daemon:
        """A (re)started daemon: new objects, the same cache and state folders (as ``argus run``)."""
        source = open_source(self.url, str(self.root / "cache"))
        parts = build_parts(source, "main", self.dash, secrets_env={}, state_dir=str(self.root / "state"))
        writer = StatusWriter(source, STATUS)
        self.daemon = Daemon(
            parts, writer, lease=Lease(source, "argus-1", ttl=30), observe_interval=1, metrics=Metrics()
        )
        return self.daemon

    def tick(self, times: int = 1) -> Daemon:
        assert self.daemon is not None
        for _ in range(times):
            self.daemon.on_push(None)  # as the remote's webhook would: fetch on this tick
            assert self.daemon.run_once() == 0.0, self.daemon.last_error
        return self.daemon


@pytest.fixture(scope="module")
def env(ray_head: RayHead, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("forgery")
    users = root / "users"
    for user in ("vera", "wade"):
        (users / user).mkdir(parents=True)
    repo = ConfigRepo(root)
    repo.write("cluster.yaml", cluster_yaml(root / "hf", users, ray_head.serve_port))
    repo.commit_push("cluster")
    dash = Dashboard(ray_head.dashboard_url)
    env = Env(repo, f"file://{repo.bare}", dash, root)
    env.start()
    env.tick()
    try:
        yield env
    finally:
        for job in jobs(dash, "vera") + jobs(dash, "wade"):
            if job.get("status") in ACTIVE:
                stop_job(dash, str(job["submission_id"]))


def jobs(dash: Dashboard, user: str, task: str | None = None) -> list[dict[str, Any]]:
    prefix = f"argus--{user}--{task}--" if task else f"argus--{user}--"
    return [j for j in dash.get("/api/jobs/") if str(j.get("submission_id") or "").startswith(prefix)]


def task_yaml(command: str, gpus: int = 1) -> dict[str, Any]:
    return {"kind": "Task", "workload": "command", "command": command, "gpus_per_node": gpus}


def until(env: Env, check: Any, what: str, timeout: float = 180.0) -> Any:
    """Tick the daemon until ``check()`` holds (as its observe timer would)."""

    def ticked() -> Any:
        env.tick()
        return check()

    return wait_for(ticked, what, timeout=timeout)


def forge(env: Env, edit: dict[str, dict[str, Any]], message: str = "argus: 1 transition(s)") -> str:
    """vera's push: the status branch as argus would write it, edited, pushed to the remote."""
    work = env.root / "vera"
    if not work.exists():
        git(env.root, "clone", "-q", env.url, str(work))
    git(work, "fetch", "-q", "origin")
    git(work, "checkout", "-q", "-B", STATUS, f"origin/{STATUS}")
    for path, doc in edit.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(yaml.safe_dump(doc, sort_keys=False))
    git(work, "add", "-A")
    git(work, "-c", "user.name=argus", "-c", "user.email=argus@localhost", "commit", "-q", "-m", message)
    git(work, "push", "-q", "--force", "origin", f"HEAD:refs/heads/{STATUS}")
    return git(work, "rev-parse", "HEAD").strip()


def remote_docs(env: Env) -> dict[str, dict[str, Any]]:
    return read_documents(str(env.repo.bare), STATUS)


def remote_readme(env: Env) -> str:
    return git(env.repo.bare, "show", f"{STATUS}:README.md")


def integrity(env: Env) -> list[str]:
    assert env.daemon is not None
    return list(env.daemon.health().get("integrity", []))


def test_a_forged_succeeded_record_does_not_stop_the_task(env: Env) -> None:
    env.repo.write("users/wade/tasks/train.yaml", task_yaml("python3 -c \"print('wade ran')\""))
    env.repo.commit_push("wade: train")
    # vera computes wade's run from the public file and records it SUCCEEDED before argus sees it.
    assert env.daemon is not None
    desired = env.daemon.parts.revisions.read().desired
    task = desired.tasks[ObjectKey("wade", "task", "train")]
    sid, digest = submission_id(task), task_spec_hash(task)
    record = {"submission_id": sid, "spec_hash": digest, "status": "SUCCEEDED", "end_time": 1}
    forged = forge(
        env, {task.key.path: {"object": str(task.key), "kind": "Task", "state": "SUCCEEDED", "runs": [record]}}
    )
    # Ticked until submitted: the shared head's GPUs may still be coming back from the previous test's runs.
    until(env, lambda: jobs(env.dash, "wade", "train"), "wade's task submitted despite the forged record")
    assert [j["submission_id"] for j in jobs(env.dash, "wade", "train")] == [sid], "wade's task must run"
    until(env, lambda: jobs(env.dash, "wade", "train")[0]["status"] == "SUCCEEDED", "wade's run")
    env.tick(2)
    doc = remote_docs(env)[task.key.path]
    assert doc["state"] == "SUCCEEDED" and doc["runs"][-1]["submission_id"] == sid
    assert git(env.repo.bare, "rev-parse", STATUS).strip() != forged
    assert any(forged[:12] in a and "not written by argus" in a for a in integrity(env))
    assert "integrity: " in remote_readme(env) and forged[:12] in remote_readme(env)


def test_a_forged_first_seen_does_not_jump_the_queue(env: Env) -> None:
    env.repo.write("users/wade/tasks/hold.yaml", task_yaml("sleep 45", gpus=2))
    env.repo.commit_push("wade: hold every GPU")
    until(env, lambda: any(j["status"] == "RUNNING" for j in jobs(env.dash, "wade", "hold")), "hold running")
    env.repo.write("users/wade/tasks/next.yaml", task_yaml("true", gpus=2))
    env.repo.commit_push("wade: next, queued first")
    env.tick()
    time.sleep(1.5)  # first_seen has a resolution of one second
    env.repo.write("users/vera/tasks/jump.yaml", task_yaml("true", gpus=2))
    env.repo.commit_push("vera: jump, queued second")
    env.tick()
    docs = remote_docs(env)
    jump, nxt = docs["users/vera/tasks/jump.yaml"], docs["users/wade/tasks/next.yaml"]
    assert nxt["first_seen"] <= jump["first_seen"]
    forged = forge(env, {"users/vera/tasks/jump.yaml": {**jump, "first_seen": "2000-01-01T00:00:00Z"}})
    env.start()  # a restart seeds the admission order from the status branch
    env.tick()
    assert env.daemon is not None
    assert env.daemon.memory.order.first_seen[ObjectKey("vera", "task", "jump")] > 946684800
    until(env, lambda: bool(jobs(env.dash, "wade", "next")), "wade's next submitted")
    assert not any(j["status"] in ACTIVE for j in jobs(env.dash, "vera", "jump")), "vera's task went first"
    assert any(forged[:12] in a for a in integrity(env))


def test_a_forged_lease_does_not_stop_reconciling(env: Env) -> None:
    work = env.root / "vera"
    empty = git(work, "hash-object", "-t", "tree", "-w", "/dev/null").strip()
    message = json.dumps({"holder": "vera", "expires": 9e12, "auth": "0" * 64})
    forged = git(work, "commit-tree", empty, "-m", message).strip()
    git(work, "push", "-q", "--force", "origin", f"{forged}:{LEASE_REF}")
    env.start()  # a fresh daemon reads the lease before its first tick
    env.repo.write("users/wade/tasks/after-lease.yaml", task_yaml("true"))
    env.repo.commit_push("wade: after the forged lease")
    until(env, lambda: jobs(env.dash, "wade", "after-lease"), "wade's task submitted despite the forged lease")
    assert env.daemon is not None
    health = env.daemon.health()
    assert health["lease"]["held"] and forged[:12] in health["lease"]["ignored"]
    assert git(env.repo.bare, "rev-parse", LEASE_REF).strip() != forged


def test_a_deleted_status_branch_reruns_nothing_and_is_published_again(env: Env) -> None:
    env.repo.write("users/wade/tasks/once.yaml", task_yaml("true"))
    env.repo.commit_push("wade: once")
    until(env, lambda: jobs(env.dash, "wade", "once"), "once submitted")
    (run,) = jobs(env.dash, "wade", "once")
    until(env, lambda: jobs(env.dash, "wade", "once")[0]["status"] == "SUCCEEDED", "once finished")
    env.tick(2)
    assert remote_docs(env)["users/wade/tasks/once.yaml"]["state"] == "SUCCEEDED"
    env.dash.delete(f"/api/jobs/{run['submission_id']}")  # Ray forgets it, as after a head restart
    git(env.repo.bare, "update-ref", "-d", f"refs/heads/{STATUS}")  # vera deletes the branch
    env.start()
    env.tick(3)
    # Ray's listing keeps a bare entry (no labels) for a deleted job; a new run would carry argus's labels.
    rerun = [j for j in jobs(env.dash, "wade", "once") if j.get("metadata")]
    assert rerun == [], "a run recorded only on the deleted branch ran again"
    docs = remote_docs(env)
    assert docs["users/wade/tasks/once.yaml"]["state"] == "SUCCEEDED"
    assert "users/wade/tasks/train.yaml" in docs  # nothing else lost either
    assert any("missing on the remote" in a for a in integrity(env))
    assert "missing on the remote" in remote_readme(env)
