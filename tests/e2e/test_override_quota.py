"""Issue 10, "quota and admission bypass", against a real Ray head: a verl task whose override asks
for 8 GPUs per node is INVALID in the plan and never submitted, while bob's honest task beside it is
planned as usual. Every step runs the real ``argus reconcile --once`` CLI on a real git repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.jobs import stop_job
from reconciler.dashboard import Dashboard
from reconciler.testing.ray_head import RayHead
from tests.support import ConfigRepo, cluster_yaml

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]


def reconcile(repo: ConfigRepo, head: RayHead, cache: Path) -> dict[str, Any]:
    argv = ["reconcile", "--once", "--repo", str(repo.bare), "--branch", "main", "--ray", head.dashboard_url]
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *argv, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "ARGUS_CACHE_DIR": str(cache)},
        cwd=REPO_ROOT,
        check=False,
    )
    try:
        out: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from exc
    return out


def bobs_jobs(dash: Dashboard, task: str) -> list[dict[str, Any]]:
    """Every Ray job (any state) whose metadata names bob's ``task``: what argus would have submitted."""
    jobs = dash.get("/api/jobs/")
    return [j for j in jobs if (j.get("metadata") or {}).get("argus-user") == "bob" and task in str(j.get("metadata"))]


def test_an_override_taking_more_gpus_is_invalid_and_never_submitted(ray_head: RayHead, tmp_path: Path) -> None:
    users, common = tmp_path / "users", tmp_path / "hf"
    (users / "bob" / "model").mkdir(parents=True)
    (users / "bob" / "data").mkdir()
    (users / "bob" / "data" / "train.parquet").write_bytes(b"PAR1")
    common.mkdir()
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", cluster_yaml(common, users, ray_head.serve_port, users={"bob": {"gpus": 1}}))
    greedy = {
        "kind": "Task",
        "workload": "grpo",
        "model": "$HOME/model",
        "data": {"train": "$HOME/data/train.parquet"},
        "gpus_per_node": 1,  # what admission and bob's quota of 1 GPU count
        "overrides": ["data.max_prompt_length=64", "trainer.n_gpus_per_node=8"],  # what verl would take
    }
    repo.write("users/bob/tasks/greedy.yaml", greedy)
    repo.write("users/bob/tasks/honest.yaml", {**greedy, "overrides": ["data.max_prompt_length=64"], "suspend": True})
    repo.commit_push("bob asks for 8 GPUs through an override")
    dash = Dashboard(ray_head.dashboard_url)
    cache = tmp_path / "cache"
    try:
        for _ in range(2):  # a second tick changes nothing: the refusal is not a one-off
            out = reconcile(repo, ray_head, cache)
            objects = {o["object"]: o for o in out["objects"]}
            assert objects["bob/tasks/greedy"]["state"] == "INVALID", objects
            assert objects["bob/tasks/honest"]["state"] != "INVALID", objects
            errors = [e for e in out["errors"] if e["path"] == "users/bob/tasks/greedy.yaml"]
            assert [(e["line"], e["message"]) for e in errors] == [
                (
                    9,
                    "overrides[1]: `trainer.n_gpus_per_node` is derived by argus; set `gpus_per_node` instead",
                )
            ], errors
            planned = [
                (a["action"], a.get("reason", "")) for a in out["plan"]["actions"] if a["object"].endswith("/greedy")
            ]
            assert [(action, reason.split(" (")[0]) for action, reason in planned] == [
                ("keep", "not submitted: the file is invalid")
            ], planned
            assert bobs_jobs(dash, "greedy") == []
    finally:
        for job in bobs_jobs(dash, "honest"):
            if job.get("status") in ("PENDING", "RUNNING"):
                stop_job(dash, str(job["submission_id"]))
