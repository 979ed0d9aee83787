"""Backup and restore end to end: a daemon (``argus run``) runs a task to SUCCEEDED against a real Ray
head; ``argus backup`` archives its state and repository while it runs; the daemon stops; ``argus
restore`` writes a fresh state folder and a fresh bare repository at another path; a new daemon on the
restored copy re-runs nothing: no new Ray job, the task's status unchanged, no lost-anchor alert; then
the same against a fresh Ray head that never saw the job (the status branch is the record of runs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead, free_port, start_head
from tests.support import ArgusRun, ConfigRepo, git, site_repo, wait_for

pytestmark = pytest.mark.e2e

TASK = "users/dave/tasks/once.yaml"
SID = "argus--dave--once--"


def argus(*args: str) -> str:
    """``argus ARGS`` as the admin runs it (a separate process). Returns stdout; fails with stderr."""
    proc = subprocess.run([sys.executable, "-m", "reconciler.cli", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def daemon(repo: Path, cache: Path, head: RayHead, log: Path) -> tuple[ArgusRun, str]:
    listen = f"127.0.0.1:{free_port()}"
    args = ["--repo", str(repo), "--cache-dir", str(cache), "--ray", head.dashboard_url, "--listen", listen]
    args += ["--observe-interval", "1", "--serve-url", "off"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_")}
    run = ArgusRun(args, log, env).start()
    run.wait_serving(f"http://{listen}/healthz")
    return run, listen


def ticks(listen: str) -> int:
    """Ticks the daemon finished (the reconcile-duration histogram's count), 0 before the first."""
    try:
        text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=5).read().decode()
    except OSError:
        return 0
    match = re.search(r"^argus_reconcile_duration_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def task_status(bare: Path) -> dict[str, Any]:
    return read_documents(str(bare), "argus/status").get(TASK) or {}


def jobs(dash: Dashboard) -> list[str]:
    return sorted(
        str(j.get("submission_id")) for j in dash.get("/api/jobs/") if str(j.get("submission_id", "")).startswith(SID)
    )


def settle(run: ArgusRun, listen: str, more: int = 4) -> None:
    """Wait until the daemon has finished ``more`` ticks after its first (each observes Ray again)."""
    first = wait_for(lambda: ticks(listen), "the daemon's first tick", timeout=120)
    wait_for(lambda: ticks(listen) >= first + more, f"{more} more ticks", timeout=120)
    assert run.alive(), run.log()


def test_a_restored_daemon_reruns_nothing(ray_head: RayHead, hf_cache: Path, tmp_path: Path) -> None:
    repo: ConfigRepo = site_repo(tmp_path / "site", hf_cache, ray_head.serve_port, "dave")
    repo.write(TASK, {"kind": "Task", "workload": "command", "command": "echo trained", "gpus_per_node": 1})
    repo.commit_push("dave: one task")
    dash = Dashboard(ray_head.dashboard_url)
    cache = tmp_path / "cache"
    first, _ = daemon(repo.bare, cache, ray_head, tmp_path / "daemon-1.log")
    try:
        wait_for(lambda: task_status(repo.bare).get("state") == "SUCCEEDED", "the task SUCCEEDED", timeout=180)
        before = task_status(repo.bare)
        submitted = jobs(dash)
        assert len(submitted) == 1
        archive = tmp_path / "argus-backup.tar.gz"
        out = argus("backup", "--to", str(archive), "--repo", str(repo.bare), "--cache-dir", str(cache))
        assert "refs" in out
    finally:
        first.stop()
    assert os.stat(archive).st_mode & 0o777 == 0o600

    # A fresh machine: another state folder, another repository path.
    new_cache, new_repo = tmp_path / "restored" / "cache", tmp_path / "restored" / "config.git"
    argus("restore", str(archive), "--repo", str(new_repo), "--cache-dir", str(new_cache))
    assert os.stat(new_cache / "state" / "ownership.key").st_mode & 0o777 == 0o600
    assert (new_cache / "state" / "ownership.key").read_bytes() == (cache / "state" / "ownership.key").read_bytes()
    restored_status = git(new_repo, "rev-parse", "argus/status").strip()
    second, listen = daemon(new_repo, new_cache, ray_head, tmp_path / "daemon-2.log")
    try:
        settle(second, listen)
        assert jobs(dash) == submitted, "the restored daemon submitted a job"
        after = task_status(new_repo)
        assert after.get("state") == "SUCCEEDED" and after.get("submission_id") == before.get("submission_id")
        assert after == before, "the task's status changed"
        # With the key and anchors restored, its job is argus's own, its records and lease are trusted:
        # nothing to report (a lost key shows as foreign_job / lease_forged and rewrites records). The only
        # status commits allowed are the cluster's capacity in actual.json (the Ray head is shared with
        # other tests, whose actors may have freed a CPU since the backup) and the run's GPU-seconds in its
        # day's usage document, counted once from its job record (the first daemon reads records once a
        # minute, and may have been backed up before it counted the finished run).
        log = second.log()
        for sign in ("foreign_job", "forged", "no longer in the repository", "does not descend"):
            assert sign not in log, log
        changed = git(new_repo, "diff", "--name-only", restored_status, "argus/status").split()
        usage = [p for p in changed if p.startswith("usage/")]
        for path in usage:
            doc = json.loads(git(new_repo, "show", f"argus/status:{path}"))
            runs = {(r["object"], r["run"]) for r in doc["gpu"]}
            assert runs == {("dave/tasks/" + Path(TASK).stem, before.get("submission_id"))}, doc
            job = dash.get(f"/api/jobs/{before.get('submission_id')}")
            seconds = (job["end_time"] - job["start_time"]) / 1000.0
            assert abs(sum(r["gpu_seconds"] for r in doc["gpu"]) - seconds) < 0.01, (doc, job)
        changed = [p for p in changed if p not in usage]
        assert set(changed) <= {"actual.json"}, changed
        if changed:
            diff = git(new_repo, "diff", "-U0", restored_status, "argus/status", "--", "actual.json")
            edits = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            assert all('"capacity":' in line for line in edits), diff
    finally:
        second.stop()

    # A fresh Ray head that never saw the job: the restored status branch is the record of the run.
    fresh = start_head(num_cpus=2, num_gpus=1, resources={"worker_node": 1}, env={"HF_HUB_OFFLINE": "1"})
    try:
        third, listen = daemon(new_repo, new_cache, fresh, tmp_path / "daemon-3.log")
        try:
            settle(third, listen)
            time.sleep(2)
            assert jobs(Dashboard(fresh.dashboard_url)) == [], "the task ran again on a head that never saw it"
            assert task_status(new_repo).get("submission_id") == before.get("submission_id")
            assert task_status(new_repo).get("state") == "SUCCEEDED", third.log()
            assert "forged" not in third.log() and "foreign_job" not in third.log(), third.log()
        finally:
            third.stop()
    finally:
        fresh.stop()
