"""A preemption through whole ticks, with real git and the dashboard stand-in: Ray's stop lands a
few observations late (as it does on a busy head), and the status branch must still end with the
run PREEMPTED *and* the object that preempted it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.daemon import build_parts
from reconciler.loop import Daemon
from reconciler.server import Metrics
from reconciler.source.remote import open_source
from reconciler.status.branch import read_documents
from reconciler.status.writer import StatusWriter
from tests.support import ConfigRepo, model_yaml, two_teams
from tests.unit.fake_ray import FakeRay
from tests.unit.test_fuzz_ticks import AllowAll

TASK = "users/alice/tasks/train.yaml"
MODEL = "users/bob/models/chat.yaml"


class LateStop(FakeRay):
    """Jobs run as soon as they are accepted; a stopped job is still listed RUNNING for ``lag``
    more listings."""

    def __init__(self, lag: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.lag = lag
        self.stopping: dict[str, int] = {}

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        if method == "POST" and path.endswith("/stop"):
            sid = path.split("/")[3]
            self.stopping[sid] = self.lag
            return {"stopped": True}
        out = super().request(method, path, body, timeout=timeout)
        if method == "GET" and path == "/api/jobs/":
            for job in self.jobs.values():
                if job["status"] == "PENDING":
                    job["status"] = "RUNNING"
            for sid, left in list(self.stopping.items()):
                if left <= 0:
                    self.jobs[sid]["status"] = "STOPPED"
                    del self.stopping[sid]
                else:
                    self.stopping[sid] = left - 1
            out = [dict(j) for j in self.jobs.values()]
        return out


def _alice_borrows(tmp_path: Path) -> tuple[ConfigRepo, LateStop]:
    """alice's task on both GPUs (one borrowed from product), running; Ray stops jobs 3 listings late."""
    repo = ConfigRepo(tmp_path)
    repo.write("cluster.yaml", two_teams(tmp_path / "hf", tmp_path / "users", 8000))
    repo.write(TASK, {"kind": "Task", "workload": "command", "command": "true", "gpus_per_node": 2})
    repo.commit_push("alice borrows product's idle GPU")
    return repo, LateStop(lag=3, gpus=2)


def _daemon(repo: ConfigRepo, ray: FakeRay) -> Daemon:
    source = open_source(str(repo.bare), str(repo.bare) + "-cache")
    parts = build_parts(source, "main", ray, fs=AllowAll(), secrets_env={}, task_check=lambda t, c: [])
    return Daemon(parts, StatusWriter(source), metrics=Metrics())


def _reclaim(repo: ConfigRepo, tmp_path: Path) -> None:
    repo.write(MODEL, model_yaml(str(tmp_path / "hf" / "tiny")))
    repo.commit_push("bob's production model reclaims product's GPU")


def test_the_preemptor_survives_a_stop_that_ray_reports_late(tmp_path: Path) -> None:
    repo, ray = _alice_borrows(tmp_path)
    daemon = _daemon(repo, ray)
    docs = lambda: read_documents(str(repo.bare), "argus/status")  # noqa: E731
    for _ in range(3):
        daemon.run_once()
    assert docs()[TASK]["state"] == "RUNNING", docs()[TASK]

    _reclaim(repo, tmp_path)
    seen = []
    for _ in range(8):
        daemon.run_once()
        doc = docs()[TASK]
        seen.append((doc["state"], doc.get("preempted_by")))
    assert not ray.stopping, "Ray's stop never landed"
    # From the tick that stopped it, the run is PREEMPTED for bob's model: never RUNNING again
    # while Ray's stop lands, never without its preemptor (the resume order depends on it).
    assert seen == [("PREEMPTED", "bob/models/chat")] * len(seen), seen
    runs = docs()[TASK]["runs"]
    assert [r["status"] for r in runs] == ["PREEMPTED"], runs


def test_a_daemon_restarted_while_the_stop_lands_still_resumes_the_run(tmp_path: Path) -> None:
    repo, ray = _alice_borrows(tmp_path)
    first = _daemon(repo, ray)
    for _ in range(3):
        first.run_once()
    _reclaim(repo, tmp_path)
    first.run_once()
    assert ray.stopping  # the daemon "crashes" here: Ray has not stopped the attempt yet
    second = _daemon(repo, ray)
    for _ in range(6):
        second.run_once()
    doc = read_documents(str(repo.bare), "argus/status")[TASK]
    assert (doc["state"], doc.get("preempted_by")) == ("PREEMPTED", "bob/models/chat"), doc
    assert [r["status"] for r in doc["runs"]] == ["PREEMPTED"], doc["runs"]
    repo.remove(MODEL)
    repo.commit_push("bob deletes his model")
    for _ in range(3):
        second.run_once()
    doc = read_documents(str(repo.bare), "argus/status")[TASK]
    assert [r["submission_id"] for r in doc["runs"]][-1].endswith("--2"), doc["runs"]  # resumed, not lost


def test_a_model_preempted_down_to_no_replicas_leaves_serve_and_is_recorded(tmp_path: Path) -> None:
    """alice's model (min_replicas 0) borrows product's idle GPU; bob's model reclaims it. The
    scale-down to 0 must take alice's application out of Serve (freeing the GPU), not rebuild it at
    the file's size, and her model's document must say who preempted it."""
    repo = ConfigRepo(tmp_path)
    cluster = two_teams(tmp_path / "hf", tmp_path / "users", 8000)
    cluster["teams"]["research"]["quota"] = {"gpus": 0}
    cluster["preemption"] = {"models": True}
    repo.write("cluster.yaml", cluster)
    alice_model = "users/alice/models/chat.yaml"
    repo.write(alice_model, model_yaml(str(tmp_path / "hf" / "tiny"), replicas=1, min_replicas=0))
    repo.commit_push("alice's model borrows product's idle GPU")
    ray = FakeRay(gpus=1)
    daemon = _daemon(repo, ray)
    daemon.run_once()
    assert any(a.startswith("argus--alice--") for a in ray.apps), sorted(ray.apps)
    _reclaim(repo, tmp_path)
    for _ in range(3):
        daemon.run_once()
    assert not any(a.startswith("argus--alice--") for a in ray.apps), f"alice's app still in Serve: {sorted(ray.apps)}"
    assert any(a.startswith("argus--bob--") for a in ray.apps), sorted(ray.apps)
    alice_doc = read_documents(str(repo.bare), "argus/status")[alice_model]
    assert alice_doc.get("preempted_by") == "bob/models/chat", json.dumps(alice_doc)[:2000]
    repo.remove(MODEL)
    repo.commit_push("bob deletes his model")
    for _ in range(3):
        daemon.run_once()
    assert any(a.startswith("argus--alice--") for a in ray.apps), f"alice's model never came back: {sorted(ray.apps)}"
