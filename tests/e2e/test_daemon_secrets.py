"""``argus run`` against a real Ray head, without models: secrets never reach git, and two
daemons on one repository never both apply."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, git, site_repo, wait_for

SECRET = "wandb-0123456789abcdef-secret"
TASK = "users/dora/tasks/printenv.yaml"


@pytest.fixture
def repo(ray_head: RayHead, tmp_path: Path) -> Iterator[ConfigRepo]:
    repo = site_repo(tmp_path, tmp_path / "hf", ray_head.serve_port, "dora")
    repo.commit_push("cluster")
    yield repo


def _health(daemon: DaemonProc) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://{daemon.listen}/healthz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


def test_a_job_printing_its_environment_leaves_no_secret_in_git(
    ray_head: RayHead, repo: ConfigRepo, tmp_path: Path
) -> None:
    daemon = DaemonProc(repo, ray_head, tmp_path)
    daemon.start(extra_env={"WANDB_API_KEY": SECRET})
    try:
        command = "env | sort; printf 'the key is %s\\n' \"$WANDB_API_KEY\""
        repo.write(TASK, {"kind": "Task", "workload": "command", "command": command})
        sha = repo.commit_push("dora: print the environment")
        doc = wait_for(
            lambda: (
                (d := read_documents(str(repo.bare), "argus/status").get(TASK) or {}).get("state") == "SUCCEEDED"
                and d["runs"][-1].get("log_tail")
                and d
            ),
            "the run SUCCEEDED with its log tail on the status branch",
            timeout=120,
        )
        tail = "\n".join(doc["runs"][-1]["log_tail"])
        assert "the key is ***" in tail and "WANDB_API_KEY=***" in tail  # the job really printed it
        everything = git(repo.bare, "grep", "-h", "", "argus/status") + repo.note(sha)
        everything += git(repo.bare, "log", "--format=%B", "argus/status")
        assert SECRET not in everything
        assert SECRET not in daemon.log()
        # Ray itself has the value (the job needed it): the redaction is argus's, not luck.
        logs = Dashboard(ray_head.dashboard_url).get(f"/api/jobs/{doc['submission_id']}/logs")
        assert SECRET in logs["logs"]
    finally:
        daemon.stop()


def test_a_second_daemon_on_the_repository_reports_the_lease_and_applies_nothing(
    ray_head: RayHead, repo: ConfigRepo, tmp_path: Path
) -> None:
    first, second = DaemonProc(repo, ray_head, tmp_path / "one"), DaemonProc(repo, ray_head, tmp_path / "two")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first.start()
    try:
        wait_for(lambda: _health(first).get("ok"), "the first daemon healthy", timeout=60)
        second.start()
        health = wait_for(
            lambda: (h := _health(second)).get("lease", {}).get("other") and h, "the second sees the lease", timeout=30
        )
        holder = _health(first)["lease"]["holder"]
        assert health["ok"] is False and health["lease"]["other"] == holder
        assert f"another daemon ({holder}) holds the lease" in health["last_error"]
        assert "lease_held_elsewhere" in second.log()
        repo.write("users/dora/tasks/once.yaml", {"kind": "Task", "workload": "command", "command": "true"})
        repo.commit_push("dora: once")
        wait_for(
            lambda: (read_documents(str(repo.bare), "argus/status").get("users/dora/tasks/once.yaml") or {}).get(
                "runs"
            ),
            "the holder submits it",
            timeout=60,
        )
        jobs = Dashboard(ray_head.dashboard_url).get("/api/jobs/")
        jobs = [j for j in jobs if "--dora--once--" in j["submission_id"]]
        assert len(jobs) == 1
        assert "submit_task" not in second.log()  # the second daemon planned and applied nothing
        # The holder stops cleanly (lease released): the second takes over at its next retry.
        first.stop()
        wait_for(lambda: _health(second).get("ok"), "the second daemon takes over", timeout=60)
    finally:
        second.stop()
        first.stop()
