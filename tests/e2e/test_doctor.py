"""``argus doctor`` against the session's real Ray head: the checks a head answers pass, a missing status
branch is named with what to do and makes the exit status 1; once the branch exists that line passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "admin",
    "GIT_AUTHOR_EMAIL": "admin@example.com",
    "GIT_COMMITTER_NAME": "admin",
    "GIT_COMMITTER_EMAIL": "admin@example.com",
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def doctor(env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Run ``argus doctor`` as an admin would; returns the exit status and each check's line by name."""
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "doctor", "--timeout", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = {}
    for line in proc.stdout.splitlines():
        if line.startswith(("ok", "FAIL")) and ": " in line:
            lines[line[6:].split(": ", 1)[0]] = line
    return proc.returncode, lines


def test_doctor_names_the_missing_status_branch_and_exits_1(ray_head: Any, tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.mkdir()
    bare = tmp_path / "config.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    (work / "cluster.yaml").write_text(f"kind: Cluster\npaths:\n  users: {users}\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "cluster")
    git(work, "push", "-q", "origin", "HEAD:main")
    state = tmp_path / "cache" / "state"
    state.mkdir(parents=True)
    (state / "ownership.key").write_text("k" * 64 + "\n")
    (state / "ownership.key").chmod(0o600)
    signers = tmp_path / "allowed_signers"
    signers.write_text("admin ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")},
        "PYTHONPATH": str(ROOT),
        "ARGUS_RAY": ray_head.dashboard_url,
        "ARGUS_REPO": str(bare),
        "ARGUS_CACHE_DIR": str(tmp_path / "cache"),
        "ARGUS_SERVE_URL": ray_head.serve_url,
        "ARGUS_REQUIRE_SIGNED_COMMITS": "1",
        "ARGUS_ALLOWED_SIGNERS": str(signers),
        "ARGUS_ADMINS": "admin",
    }
    rc, lines = doctor(env)
    assert rc == 1, lines
    assert lines["status branch"].startswith("FAIL"), lines
    assert f"{bare} has no argus/status" in lines["status branch"] and "->" in lines["status branch"]
    for name in ("ray dashboard", "jobs api", "config repository", "ownership", "signing", "gpus and driver slots"):
        assert lines[name].startswith("ok"), lines[name]
    # The session's head: 2 logical GPUs and worker_node 4.
    assert "2 logical GPU, 4 worker_node" in lines["gpus and driver slots"]
    # No daemon runs here: /healthz fails too, and says so.
    assert lines["daemon /healthz"].startswith("FAIL")

    # The daemon's first write of the status branch fixes that line.
    git(work, "checkout", "-q", "--orphan", "argus/status")
    (work / "README.md").write_text("status\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "status")
    git(work, "push", "-q", "origin", "argus/status")
    rc, lines = doctor(env)
    assert rc == 1  # still no daemon
    assert lines["status branch"].startswith("ok") and "writable, last written" in lines["status branch"]
