"""A branch that blocks the status branch, on the real daemon (``argus run``), real git and a real Ray
head: created in the repository directly (past the bundled hook, which refuses it), it is reported on
/healthz and in the log for every object the daemon cannot submit, and no preemption is applied while it
is there; once it is gone the daemon records, preempts and submits as usual.

alice's best-effort task borrows product's idle GPU (two GPUs); the status branch is then renamed away
and a branch ``argus`` takes its place; bob's in-quota task would reclaim the GPU.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead
from tests.e2e.test_daemon import DaemonProc, daemon_for
from tests.support import git, two_teams, wait_for

pytestmark = pytest.mark.e2e

ALICE = "users/alice/tasks/blocked-train.yaml"
BOB = "users/bob/tasks/blocked-job.yaml"


@pytest.fixture()
def daemon(ray_head: RayHead, tmp_path: Path) -> Iterator[DaemonProc]:
    with daemon_for(ray_head, tmp_path, ("alice", "bob")) as proc:
        yield proc


def healthz(daemon: DaemonProc) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{daemon.listen}/healthz", timeout=5) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def jobs(dash: Dashboard, user: str) -> dict[str, str]:
    """This test's runs of ``user``: the Ray head is shared, and other tests ran tasks of alice and bob (of
    other names: these are this module's own)."""
    task = {"alice": "blocked-train", "bob": "blocked-job"}[user]
    return {
        str(j["submission_id"]): str(j["status"])
        for j in dash.get("/api/jobs/")
        if (j.get("metadata") or {}).get("argus-user") == user and (j.get("metadata") or {}).get("argus-task") == task
    }


def log_errors(daemon: DaemonProc, obj: str) -> list[str]:
    out = []
    for line in daemon.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("object") == obj and "error" in entry:
            out.append(str(entry["error"]))
    return out


def test_a_blocked_status_branch_is_reported_and_preempts_nothing(
    daemon: DaemonProc, ray_head: RayHead, hf_cache: Path, tmp_path: Path
) -> None:
    repo, dash = daemon.repo, Dashboard(ray_head.dashboard_url)
    users = tmp_path / "users"
    for user in ("alice", "bob"):
        (users / user).mkdir(parents=True)
    repo.write("cluster.yaml", two_teams(hf_cache, users, ray_head.serve_port))
    repo.write(ALICE, {"kind": "Task", "workload": "command", "command": "sleep 600", "gpus_per_node": 2})
    repo.commit_push("alice trains on both GPUs (she borrows product's idle one)")
    daemon.start()
    wait_for(lambda: "RUNNING" in jobs(dash, "alice").values(), "alice's run RUNNING in Ray", timeout=240)
    (alice,) = jobs(dash, "alice")
    wait_for(lambda: healthz(daemon)[0] == 200, "the daemon healthy", timeout=60)

    # The status branch is renamed away and `argus` created in its place, past the hook (the running
    # daemon may write the status branch again in between: tried until `argus` wins).
    main = git(repo.bare, "rev-parse", "main").strip()

    def swapped() -> bool:
        git(repo.bare, "update-ref", "-d", "refs/heads/argus/status", check=False)
        git(repo.bare, "update-ref", "refs/heads/argus", main, check=False)
        return bool(git(repo.bare, "rev-parse", "-q", "--verify", "refs/heads/argus", check=False))

    wait_for(swapped, "a branch argus in the status branch's place", timeout=30, every=0.1)
    repo.write(BOB, {"kind": "Task", "workload": "command", "command": "sleep 600", "gpus_per_node": 1})
    repo.commit_push("bob's in-quota task would reclaim product's GPU")

    _status, health = wait_for(
        lambda: (h := healthz(daemon))[0] == 503 and "status_branch" in h[1] and h, "/healthz not ok", timeout=60
    )
    why = health["status_branch"]
    assert "the status branch argus/status cannot be created in the repository: the branch argus" in why, health
    wait_for(lambda: log_errors(daemon, "bob/tasks/blocked-job"), "bob's task's reason in the log", timeout=60)
    assert log_errors(daemon, "bob/tasks/blocked-job")[0] == f"not submitted: {why}"
    held = wait_for(
        lambda: log_errors(daemon, "alice/tasks/blocked-train"), "alice's held preemption in the log", timeout=60
    )
    assert held[0] == f"not preempted for bob/tasks/blocked-job: {why}"
    for _ in range(5):  # several ticks (one a second): alice keeps running, bob is never submitted
        assert jobs(dash, "alice") == {alice: "RUNNING"} and not jobs(dash, "bob")
        time.sleep(1)
    assert daemon.run is not None and daemon.run.alive()
    assert git(repo.bare, "rev-parse", "-q", "--verify", "refs/heads/argus/status", check=False) == ""

    git(repo.bare, "update-ref", "-d", "refs/heads/argus")
    wait_for(lambda: healthz(daemon)[0] == 200, "/healthz ok once the branch is gone", timeout=60)
    wait_for(lambda: jobs(dash, "alice").get(alice) == "STOPPED", "alice's run preempted", timeout=120)
    wait_for(lambda: jobs(dash, "bob"), "bob's run submitted", timeout=120)
    doc = wait_for(
        lambda: (
            (d := read_documents(str(repo.bare), "argus/status").get(ALICE) or {}).get("state") == "PREEMPTED" and d
        ),
        "alice PREEMPTED on the status branch",
        timeout=120,
    )
    assert doc.get("preempted_by") == "bob/tasks/blocked-job", doc
    (bob,) = jobs(dash, "bob")
    recorded = read_documents(str(repo.bare), "argus/status")[BOB]["runs"]
    assert [r["submission_id"] for r in recorded] == [bob]
